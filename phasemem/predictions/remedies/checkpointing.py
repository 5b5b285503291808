"""Activation checkpointing as a change to the blocks: the stack of repeated layers among forward's
saved activations, what each checkpointed layer keeps, and the recompute in backward."""
from __future__ import annotations

import numpy as np

from ...vocab import C, P
from ..blocks import Facts
from .cross_entropy import _vocab
from .per_token import block_growth

#: Activation checkpointing's default granularity: every block (1); 2 checkpoints every other block.
CKPT_EVERY = 1
#: A layer period must repeat this share of the saved activations' sizes (a transformer's blocks are
#: identical; 0.9 leaves room for the first block's extra casts).
PERIOD_MATCH = 0.9
#: Fewer repeated blocks than this are no stack of layers to checkpoint.
MIN_BLOCKS = 2


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
    added: tuple[list, list, list] = ([], [], [])
    kinds: list = []
    periods: dict = {}
    steps = 0
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
