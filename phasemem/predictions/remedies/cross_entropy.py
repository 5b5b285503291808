"""The loss's remedies, on the vocabulary-sized blocks (logits, their fp32 copies, softmax, gradients):
a chunked cross-entropy, and logits kept in half precision."""
from __future__ import annotations

import numpy as np

from ...analysis.sizes import in_sorted
from ...units import format_bytes
from ...vocab import P
from ..blocks import Facts
from ..scaling import COMPILED_SHARE, CONSTANT, LINEAR, compiled

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
