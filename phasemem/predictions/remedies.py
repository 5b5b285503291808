"""The remedies and scalings a what-if replays, each a function of what the trace shows.

A remedy takes ``Facts`` (the trace's blocks, shapes and categories, read once) and returns a ``Change``
(blocks dropped, resized, re-timed or added) or the reason it does not apply; every threshold is read off
a recorded pair (fixtures/pairs, fixtures/pairs2: docs/what-if.md)."""
from __future__ import annotations

from functools import partial

import numpy as np

from .scaling import (BATCH_FACTORS, COMPILED_SHARE, CONSTANT, LINEAR, QUADRATIC, SEQ_FACTORS, Growth, compiled,
                      growth)
from ..analysis.infer.frames import per_stack
from ..analysis.sizes import in_sorted
from .blocks import Facts
from ..units import format_bytes
from ..vocab import C, P

#: Token chunks a chunked cross-entropy works through one at a time (Liger's fused linear
#: cross-entropy and fixtures/record_pairs.py's chunked_ce use 4-8); the vocabulary-sized blocks shrink by it.
CE_CHUNKS = 4
#: A chunk's working set, in units of one chunk's fp32 logits: the logits and one full-size working copy
#: (logsumexp's exp, or the softmax that becomes their gradient). Read off fixtures/pairs/chunked_ce:
#: each chunk's 786 MiB of fp32 logits beside a second 786 MiB block, nothing larger.
CHUNK_WORKING_SET = 2
#: ... or, when the chunk is small beside the head, what is alive while the chunk's share of the head's
#: weight gradient is made: the chunk's fp32 logits and their half-precision gradient (1.5 chunks),
#: the product in half precision, then in fp32 (1.5 x the weight): fixtures/pairs2/gpt's chunked_ce_8
#: peaks there (98 + 49 + 74 + 147 MiB), its chunked_ce_2 at the logsumexp (2 x 393 MiB).
CHUNK_WITH_GRAD, WEIGHT_GRAD_PRODUCT = 1.5, 1.5
#: Besides the chunks, a fused linear cross-entropy holds the head weight's gradient in fp32 (one
#: block of the weight's size, from the loss to backward) and, while the loss runs, the weight cast to
#: the logits' precision (half of it): fixtures/pairs/chunked_ce's 147.4 and 73.7 MiB.
HEAD_GRAD_SHARE, HEAD_CAST_SHARE = 1.0, 0.5
#: Activation checkpointing's default granularity: every block (1); 2 checkpoints every other block.
CKPT_EVERY = 1
#: 8-bit optimizer state (bitsandbytes' AdamW8bit) keeps 1 byte per number where torch keeps 4.
STATE_FACTOR = 0.25
#: ... and does not apply where the state is already below its gradients (patterns.optimizer.SMALLER).
SMALLER_STATE = 0.98
#: A block of half a weight's gradient's size is the weight's half-precision copy when made at most
#: this many times per such gradient: autocast's cast in forward and the half-precision weight gradient
#: in backward, once per step each. Made more often, that size also holds per-token values (at B 2,
#: fixtures/capacity's GPT's 4.5 MiB is both its MLP weights' bf16 casts and its qkv outputs): then a
#: forward block followed by more of its op's blocks is the cast, the rest scale. Before, any block of
#: a pre-existing block's size was a copy: cuBLAS's 32 MiB workspace made fixtures/pairs2/llama's 32 MiB
#: attention scores constant (seq x4 -12 %), and at B 2 llama's 2.75 MiB MLP activations were its MLP
#: weights' size (-3.4 % at batch x7).
COPIES_PER_WEIGHT = 2
#: A layer period must repeat this share of the saved activations' sizes (a transformer's blocks are
#: identical; 0.9 leaves room for the first block's extra casts).
PERIOD_MATCH = 0.9
#: Fewer repeated blocks than this are no stack of layers to checkpoint.
MIN_BLOCKS = 2


def _fused_optimizer(f: Facts):
    temps = f.members("optimizer_temporaries")
    if not len(temps):
        return ("no optimizer temporaries in this trace (the optimizer is fused already, updates without "
                "intermediates, or ran where the trace does not show it)")
    ch = f.change(f"A fused optimizer updates in place: the {len(temps)} update temporaries "
                  f"({format_bytes(int(f.size[temps].max()))} the largest) are not made.",
                  "fused AdamW allocates nothing after its first step (measured on the H200, torch 2.11)")
    ch.size[temps] = 0
    return ch


def _vocab(f: Facts) -> np.ndarray:
    return f.members("logits", "softmax_spike", "logits_release")


def _logits(f: Facts) -> tuple[np.ndarray, str | None]:
    """(the vocabulary-sized blocks, None or why no logits remedy applies): none seen, or the loss's own
    vocabulary-sized blocks (those after the first) made inside a compiled graph, which may fuse the loss."""
    vocab = _vocab(f)
    if not len(vocab):
        return vocab, ("no logits found: no vocabulary-sized output read by a softmax or cross-entropy in this trace "
                       "(a loss such as logits.sum() makes no such shape)")
    later = vocab[np.argsort(f.alloc[vocab])][1:]
    if len(later) and compiled(f.an.trace)[f.an.trace.stack[f.alloc[later]]].mean() >= COMPILED_SHARE:
        return vocab, ("the loss runs inside a compiled graph (torch.compile): it may be fused there, and what a "
                       "chunked or half-precision loss would change in it cannot be told from the trace")
    return vocab, None


def _chunked_cross_entropy(f: Facts, chunks: int = CE_CHUNKS):
    vocab, why = _logits(f)
    if why:
        return why
    head = int(f.an.facts.param_sizes.max()) if len(f.an.facts.param_sizes) else 0
    ch = f.change(f"The loss is computed over {chunks} chunks of the tokens, one at a time, its gradient with it "
                  f"(a fused linear cross-entropy): the {len(vocab)} vocabulary-sized blocks (logits, fp32 copies, "
                  f"softmax, gradients) never exist whole; while the loss runs, one chunk's fp32 logits and a working "
                  f"copy of them do, with the head weight's gradient in fp32 ({format_bytes(head)}) kept until "
                  f"backward; nothing vocabulary-sized is kept for backward.",
                  f"{chunks} chunks",
                  f"a chunk's working set is {CHUNK_WORKING_SET} x one chunk of the fp32 logits (the largest "
                  f"vocabulary-sized block / {chunks}), or, if more, {CHUNK_WITH_GRAD:g} chunks beside "
                  f"{WEIGHT_GRAD_PRODUCT:g} x the head weight (its gradient's share, half precision then fp32)",
                  "the head weight is the largest parameter block; its fp32 gradient is held from the loss to "
                  "backward and its half-precision cast while the loss runs",
                  "the gradient of the hidden states (batch x sequence x width, small beside the logits) is not added")
    added: tuple[list, list, list, list] = ([], [], [], [])
    per_step: dict[int, list] = {}
    for p in f.patterns:
        if p.members and p.kind in ("logits", "softmax_spike", "logits_release"):
            per_step.setdefault(p.step, []).append(np.asarray(p.members, np.int64))
    for s, parts in sorted(per_step.items()):
        mine = np.unique(np.concatenate(parts)) + f.n_pre
        made = np.sort(f.alloc[mine])
        first = int(made[0])
        bwd = f.runs(s, "backward")[0]
        bwd = bwd[bwd > first]
        last = int(bwd[0]) - 1 if len(bwd) else int(min(f.free[mine].max(), f.n - 1))
        # the chunks run where the loss made its own vocabulary-sized blocks (the fp32 copy, log-softmax):
        # after the logits, and after whatever ran between forward and the loss (a zero_grad's frees)
        after = made[(made > first) & (made <= last)]
        start = int(after[0]) if len(after) else first + 1
        last = max(last, start)
        chunk = int(f.size[mine].max()) // chunks  # one chunk of the fp32 logits
        mid = (start + last + 1) // 2
        # the two moments of a chunk, one after the other within the loss, so that the replay takes the
        # larger at any batch: the logsumexp's copy, then the weight gradient's share
        for a0, a1, size, kind in ((start, max(mid - 1, start), CHUNK_WORKING_SET * chunk, LINEAR),
                                   (mid, last, int(CHUNK_WITH_GRAD * chunk), LINEAR),
                                   (mid, last, int(WEIGHT_GRAD_PRODUCT * head), CONSTANT),
                                   (start, last, int(HEAD_GRAD_SHARE * head), CONSTANT),
                                   (start, last, int(HEAD_CAST_SHARE * head), CONSTANT)):
            added[0].append(a0)
            added[1].append(a1)
            added[2].append(size)
            added[3].append(kind)
    # backward's own copies of the logits' gradient (the bf16 cast of the fp32 one, for the head's
    # matmul: fixtures/pairs2/gpt's 393 MiB) are no shape's member, but are vocabulary-sized too
    later = np.flatnonzero((f.phase_alloc == P["backward"]) & in_sorted(f.size, np.unique(f.size[vocab])))
    ch.size[vocab] = 0
    ch.size[later] = 0
    ch.added = tuple(np.asarray(x, np.int64) for x in added[:3])
    ch.added_kind = np.asarray(added[3], np.int8)
    return ch


def _bf16_logits(f: Facts):
    vocab, why = _logits(f)
    if why:
        return why
    small = int(f.size[vocab].min())
    wide = vocab[f.size[vocab] >= 2 * small]
    if not len(wide) or len(wide) == len(vocab):
        return ("the vocabulary-sized blocks all have one width: no fp32 upcast of bf16/fp16 logits is seen "
                "(the model computes its logits in fp32, or never in half precision)")
    # the upcast copy itself is a temporary the loss reads once (freed before backward): without it,
    # the loss reads the half-precision logits and nothing takes its place
    copy = wide[(f.phase_alloc[wide] != P["backward"]) & (f.phase_free[wide] != P["backward"])]
    ch = f.change(f"The loss reads the half-precision logits without an fp32 copy: the {len(copy)} fp32 copies "
                  f"(made and freed before backward) are not made, the other {len(wide) - len(copy)} fp32 "
                  f"vocabulary-sized blocks (log-softmax, gradients) are half as large.",
                  "the loss runs outside autocast: inside it, cross_entropy upcasts to fp32 by itself")
    ch.size[wide] = f.size[wide] // 2
    ch.size[copy] = 0
    return ch


def _zero_grad_before_forward(f: Facts):
    moved = []
    for s in range(len(f.an.segmentation.steps)):
        fwd = f.runs(s, "forward")[0]
        for z0, z1 in zip(*f.runs(s, "zero_grad")):
            if not len(fwd) or fwd[0] >= z0:
                continue
            # only what already exists before forward can be freed there: not the gradients an
            # optimizer run inside backward frees as it makes them (h6_optim_in_backward)
            idx = f.freed_in(int(z0), int(z1))
            moved.append((idx[f.alloc[idx] < int(fwd[0])], int(fwd[0]) - 1))
    if not moved or not sum(len(i) for i, _ in moved):
        return "zero_grad already runs before forward (or frees nothing after it): nothing to move"
    ch = f.change("zero_grad(set_to_none=True) moves before forward: last step's gradients are freed before the "
                  "forward's activations are made instead of after them.",
                  "the gradients are not read between forward and the old zero_grad")
    for idx, at in moved:
        ch.free[idx] = at
    return ch


def _in_torch_layer(trace) -> np.ndarray:
    """Per stack id (``per_stack``): the innermost Python frame is torch's layer code (torch/nn/)."""
    def of(frames):
        py = [fn.replace("\\", "/") for fn, _, _ in frames if fn.endswith(".py")]
        return bool(py) and "/torch/nn/" in py[0]

    return per_stack(trace, of)


def _weight_copies(f: Facts, candidates: np.ndarray) -> np.ndarray:
    """Of ``candidates`` (a mask), the weights' copies, which do not grow with the tokens. Of a
    gradient's own size: in backward, a weight gradient's partial sum (a tied weight's), where made no
    more often than the gradients of that size (more is per-token: B 2 llama's 2.75 MiB); in forward, a weight's fp32 copy (MAML's fast weights) where more of its op's blocks follow it or the
    trace has no frames. Of half a gradient's size (a bf16 cast in forward, the bf16 weight gradient in
    backward): all of them where they are made at most COPIES_PER_WEIGHT times per gradient; where
    per-token blocks share the size, those of forward followed by more of their op's blocks. Without
    gradients in the trace, blocks of a pre-existing block's size (the weights and what else was there)."""
    grads = np.flatnonzero((f.cat == C["gradient"]) & (f.alloc >= 0))
    if not len(grads):
        return candidates & in_sorted(f.size, np.unique(f.an.facts.param_sizes))
    idx = np.flatnonzero(candidates)
    stack, ev = f.an.trace.stack, f.alloc[idx]
    nxt = np.minimum(ev + 1, f.n - 1)
    framed = stack[ev] >= 0
    # a cast is followed by more of its op's blocks (the input's or bias's cast, the output: the same
    # stack), and autocast casts weights inside torch's layers; a matmul on the program's own line
    # copies its inputs the same way but casts no weight (capacity run 2's ViT: q and k, 0.75 MiB)
    same_op = framed & (stack[nxt] == stack[ev]) & (nxt > ev) & _in_torch_layer(f.an.trace)[stack[ev]]
    fwd = f.phase_alloc[idx] == P["forward"]
    out = np.zeros(len(f.size), bool)
    gs, gn = np.unique(f.size[grads], return_counts=True)
    gpos = np.minimum(np.searchsorted(gs, f.size[idx]), len(gs) - 1)
    eq = gs[gpos] == f.size[idx]
    # backward: one partial sum per gradient and step at most (a tied head's); more is per-token
    made_bwd = np.bincount(gpos[eq & ~fwd], minlength=len(gs))
    out[idx[eq & ~fwd & (made_bwd <= gn)[gpos]]] = True
    # forward: a weight's fp32 copy cannot be told from a per-token block of its size by the frames (a
    # rotary line makes several per-token blocks in a row): only where the trace has none
    out[idx[eq & fwd & ~framed]] = True
    half, n = np.unique(f.size[grads] // 2, return_counts=True)
    pos = np.minimum(np.searchsorted(half, f.size[idx]), len(half) - 1)
    hit = (half[pos] == f.size[idx]) & ~eq
    made = np.bincount(pos[hit], minlength=len(half))
    alone = hit & (made <= COPIES_PER_WEIGHT * n)[pos]
    out[idx[alone | (hit & fwd & same_op)]] = True
    return out


def _batch_dependent(f: Facts) -> np.ndarray:
    """Blocks that scale with the tokens: made in forward, loss or backward, or an input; not the
    weights, their gradients, the optimizer's state, the weights' copies, or one-off workspaces."""
    made = np.isin(f.phase_alloc, [P["forward"], P["loss"], P["backward"]]) | (f.cat == C["input"])
    kept = np.isin(f.cat, [C["parameter"], C["gradient"], C["optimizer_state"]])
    out = made & ~kept & (f.alloc >= 0)
    out &= ~_weight_copies(f, out)
    out[f.members("workspace", "gradients")] = False
    return out


def block_growth(f: Facts) -> Growth:
    """How each block grows with the tokens (scaling.growth), once per trace."""
    if f._growth is None:
        vocab = np.zeros(len(f.size), bool)
        vocab[_vocab(f)] = True
        step = np.where(f.alloc >= 0, f.an.step_of[np.maximum(f.alloc, 0)], -1)
        recompute = bool(len(f.members("checkpoint_recompute", "forward_rerun")))
        f._growth = growth(f.an.trace, f.alloc, f.free, f.size, f.phase_alloc,
                           f.phase_free, step, _batch_dependent(f), vocab, recompute)
    return f._growth


def _scale(f: Facts, batch: float = 1.0, seq: float = 1.0):
    g = block_growth(f)
    scaled = g.kind != CONSTANT
    if not scaled.any():
        return "no block made in forward or backward scales with the tokens here"
    if seq != 1 and not g.sequence_known:
        return g.evidence
    quad = int((g.kind == QUADRATIC).sum())
    if batch != 1:
        text = (f"The batch x {batch:g}: the {int(scaled.sum())} blocks that hold per-token values (activations, "
                f"per-token temporaries, logits, inputs) x {batch:g}; parameters, gradients and optimizer state stay.")
    else:
        text = (f"The sequence x {seq:g}: {int(scaled.sum()) - quad} per-token blocks x {seq:g}"
                + (f", {quad} attention-score blocks (batch x heads x T x T) x {seq * seq:g}" if quad else "")
                + "; parameters, gradients and optimizer state stay.")
    scaled = np.round(f.size * g.factor(batch, seq))
    if not (np.abs(scaled) < _I64).all():  # an int64 cast of these would wrap (a corrupt trace's sizes)
        return (f"a block of {format_bytes(int(f.size.max()))} scaled so passes 64 bits: these sizes are no real "
                "run's (a corrupt trace)")
    ch = f.change(text, "blocks of a parameter's size are weights' copies (bf16 casts) and do not scale",
                  "the allocator's rounding (512 B, 2 MiB for large blocks) is ignored",
                  *([g.evidence] if seq != 1 else []))
    ch.size = scaled.astype(np.int64)
    return ch


_I64 = float(1 << 63)


def _smaller_optimizer_state(f: Facts):
    state = np.flatnonzero(f.cat == C["optimizer_state"])
    if not len(state):
        return "no optimizer state in this trace"
    # State already below its gradients is kept in fewer bits or factored: a quarter of it is no 8-bit
    # optimizer's (h16_adam8bit's blockwise 8-bit Adam, 0.50x its fp32 gradients, was "kept in a quarter").
    small = [p.details["ratio_to_gradients"] for p in f.patterns if p.kind == "optimizer_state_init"
             and p.details.get("ratio_to_gradients") is not None and p.details["ratio_to_gradients"] < SMALLER_STATE]
    if small:
        return (f"the optimizer's state is already smaller than its gradients ({min(small):.2f}×): kept in fewer bits "
                f"or factored, it would not shrink to a quarter again")
    # the most state alive at once, not every state block summed: an optimizer that rebinds its state
    # makes it anew every step (wild/wedsonlin_medium512_train: 3.15 GiB at a time, 6.31 GiB made in all)
    points = np.concatenate([f.alloc[state], f.free[state]])
    change = np.concatenate([f.size[state], -f.size[state]])[np.argsort(points, kind="stable")]
    most = int(np.cumsum(change).max())
    ch = f.change(f"8-bit optimizer state: {format_bytes(most)} of state kept in a quarter "
                  f"of the bytes.", f"{STATE_FACTOR:g}× the state's bytes (remedies.STATE_FACTOR)")
    ch.size[state] = (f.size[state] * STATE_FACTOR).astype(np.int64)
    return ch


def _layer_period(sizes: np.ndarray, seen: dict | None = None) -> int | None:
    """The smallest period the sizes repeat with, over at least MIN_BLOCKS blocks. ``seen`` caches it
    by the sizes themselves: the steps of one loop save the same sizes (2,179 steps, one search)."""
    key = sizes.tobytes()
    if seen is not None and key in seen:
        return seen[key]
    found = None
    for p in range(2, len(sizes) // MIN_BLOCKS + 1):
        if np.count_nonzero(sizes[p:] == sizes[:-p]) >= PERIOD_MATCH * (len(sizes) - p):
            found = p
            break
    if seen is not None:
        seen[key] = found
    return found


def _layer_rows(sizes: np.ndarray, period: int) -> tuple[int, int]:
    """(first, count) of the whole repeated blocks among a step's saved sizes: the offset whose rows
    of ``period`` end with the size saved just before the first (each block's output is the next
    block's input: fixtures/pairs2/vit's 24 MiB residual), then whose rows repeat the first most
    often (the embedding's blocks before them, the head's after them, are no layer)."""
    best = None
    for o in range(period):
        rows = (len(sizes) - o) // period
        if rows < MIN_BLOCKS:
            continue
        body = sizes[o:o + rows * period].reshape(rows, period)
        # the chain first: the last block's output may not be saved (a mean pool before the head), so
        # the chained offset can repeat one row fewer (fixtures/pairs2/vit)
        key = (bool(o) and body[0, -1] == sizes[o - 1], int((body == body[0]).all(axis=1).sum()), -o)
        if best is None or key > best[0]:
            best = (key, o, rows)
    return (best[1], best[2]) if best else (0, len(sizes) // period)


def _activation_checkpointing(f: Facts, every: int = CKPT_EVERY):
    if f.members("checkpoint_recompute").size:
        return "backward recomputes forward's tensors already (checkpoint_recompute)"
    if f.members("forward_rerun").size:
        return "the program runs forward again in its backward phase already (forward_rerun)"
    vocab = np.zeros(len(f.size), bool)
    vocab[_vocab(f)] = True
    saved = (f.phase_alloc == P["forward"]) & (f.phase_free == P["backward"]) & (f.cat == C["activation"]) & ~vocab
    which = "every repeated block" if every == 1 else f"every {every}th repeated block (the first, then every {every})"
    ch = f.change(f"Activation checkpointing of {which}: forward keeps only a checkpointed block's input; "
                  "backward recomputes one block at a time.",
                  "a block's input is the previous block's output: the saved tensor of each repeated block with the "
                  "size of the one saved just before the first block (the embedding's output); else its most "
                  "common size",
                  "backward makes a checkpointed block's tensors again just before it frees the first of them, "
                  "and frees each where the trace freed it (the ripples)")
    added, kinds, steps, periods = ([], [], []), [], 0, {}
    for s, (a, b, _) in enumerate(f.an.segmentation.steps):
        idx = f.made_in(a, b)
        idx = idx[saved[idx]]
        period = _layer_period(f.size[idx], periods) if len(idx) >= 2 * MIN_BLOCKS else None
        if period is None:
            continue
        start, blocks = _layer_rows(f.size[idx], period)
        body = idx[start:start + blocks * period].reshape(blocks, period)
        before = int(f.size[idx[start - 1]]) if start else -1
        same = np.flatnonzero(f.size[body[0]] == before)
        if len(same):  # each block's output, the next one's input: what a checkpoint keeps
            keep = np.full(blocks, same[-1])
        else:
            sizes, counts = np.unique(f.size[body[0]], return_counts=True)
            keep = np.argmax(f.size[body] == sizes[np.argmax(counts)], axis=1)
        drop = np.ones(body.shape, bool)
        drop[np.arange(blocks), keep] = False
        drop[np.arange(blocks) % every != 0] = False  # blocks left unchecked keep what they save
        ch.size[body[drop]] = 0
        # the recompute: a checkpointed block's tensors are made again when backward reaches it (just
        # before the first of them is freed) and freed where they were; one block at a time
        for row, gone in zip(body, drop):
            if gone.any():
                again = row[gone]
                added[0].append(np.full(len(again), max(int(f.free[row].min()) - 1, 0)))
                added[1].append(f.free[again])
                added[2].append(f.size[again])
                kinds.append(block_growth(f).kind[again])  # a score made again grows as the score did
        steps += 1
    if not steps:
        return "no stack of repeated blocks among the saved activations: nothing to checkpoint by block"
    ch.added = tuple(np.concatenate(x).astype(np.int64) if x else np.zeros(0, np.int64) for x in added)
    ch.added_kind = np.concatenate(kinds).astype(np.int8) if kinds else np.zeros(0, np.int8)
    return ch


#: The remedies, by name (what ``--what-if`` prints and the JSON's "remedy" says).
REMEDIES = {
    "fused_optimizer": _fused_optimizer,
    "chunked_cross_entropy": _chunked_cross_entropy,
    "bf16_logits": _bf16_logits,
    "zero_grad_before_forward": _zero_grad_before_forward,
    "activation_checkpointing": _activation_checkpointing,
    "smaller_optimizer_state": _smaller_optimizer_state,
}
#: The scalings, replayed as the remedies are (issue 30): batch_x0.5 ... seq_x4.
SCALINGS = {**{f"batch_x{b:g}": partial(_scale, batch=b) for b in BATCH_FACTORS},
            **{f"seq_x{q:g}": partial(_scale, seq=q) for q in SEQ_FACTORS}}
