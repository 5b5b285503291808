"""The report's notes on categories: what 'other' holds at the peak where it is much of it, and what the
rules for blocks made before the recording named (categories.py decides; this only says it)."""
from __future__ import annotations

import numpy as np

from ..units import format_bytes
from ..vocab import CATEGORY_NAMES, PHASES, C, P
from .categories import shows_training
from .category_curves import CategoryCurves
from .facts import Context

#: The note on what 'other' holds is written where it is more than this share of the peak (issue 40:
#: wild/bcrafton_cs336 80 %, wedsonlin_medium512_train 27 %, cranberrii_ftcourse 19 %,
#: silmont_mem_snapshot 17 % before the rules for blocks made before the recording).
OTHER_NOTE_SHARE = 0.10
#: Sizes of the cuBLAS workspace torch makes once per handle and stream, when no stack says so: 8 MiB +
#: 128 KiB (the default ``CUBLAS_WORKSPACE_CONFIG`` ":4096:2:16:8", the wild CS336 snapshots' two) and
#: 32 MiB (on Hopper: our H100/H200 fixtures' ``at::cuda::getNewWorkspace`` blocks). Named in the note
#: only, where such a block is never freed: the category stays 'other'.
WORKSPACE_SIZES = (8519680, 33554432)
#: The note names at most this many groups of blocks, the largest first.
OTHER_GROUPS = 4


def other_groups(ctx: Context, codes: np.ndarray, event: int) -> list[tuple[str, int, int]]:
    """What the 'other' bytes alive at the level ``event`` reaches are, grouped by where the blocks were
    made and where they end: (words, blocks, bytes), the most bytes first."""
    life, tl, n = ctx.timeline.lifetimes, ctx.timeline, ctx.n
    q = event if tl.active_after[event] < tl.active_before[event] else event + 1
    idx = np.flatnonzero((life.alloc_event < q) & (life.free_event >= q) & (codes == C["other"]))
    if not len(idx):
        return []
    a, f, size = life.alloc_event[idx], life.free_event[idx], life.size[idx]
    pre, kept = a < 0, f >= n
    by_stack = np.isin(life.addr[idx], ctx.trace.live_workspaces)
    by_stack[~pre] = ctx.made_by_workspace_getter(a[~pre])
    by_stack &= kept
    by_size = kept & ~by_stack & np.isin(size, WORKSPACE_SIZES)
    # one key per group: its kind, the phase that made it and the one that freed it (len(PHASES): kept)
    labels, k = ctx.seg.labels, len(PHASES) + 1
    made_in = np.where(pre, 0, labels[np.maximum(a, 0)])
    freed_in = np.where(kept, len(PHASES), labels[np.minimum(f, n - 1)])
    kind = np.select([by_stack, by_size, pre & kept, pre], [0, 1, 2, 3], 4)
    key = (kind * k + made_in) * k + freed_in
    keys, inverse = np.unique(key, return_inverse=True)
    blocks = np.bincount(inverse, minlength=len(keys))
    total = np.bincount(inverse, weights=size, minlength=len(keys)).astype(np.int64)
    trains = shows_training(ctx)

    def where(code):
        return "outside every phase" if code == P["other"] else f"in {PHASES[code]}"

    def words(key):
        kind, made, freed = key // (k * k), key // k % k, key % k
        fate = "kept to the end" if freed == len(PHASES) else f"freed {where(freed)}"
        return ("made by a math library's workspace getter (its stack says so) and kept",
                "kept, each of a cuBLAS workspace's size (no stack says what made it)",
                "made before the recording and kept to the end"
                + (", pairing with no gradient (frozen weights, buffers, a copy of the weights, a cache)" if trains else ""),
                f"made before the recording and {fate}",
                f"made {where(made)} and {fate}")[kind]

    out: dict[str, list[int]] = {}  # the few groups' words (two keys can read alike: a workspace made in any phase)
    for key, c, b in zip(keys.tolist(), blocks.tolist(), total.tolist()):
        g = out.setdefault(words(key), [0, 0])
        g[0] += c
        g[1] += b
    return sorted(((w, c, b) for w, (c, b) in out.items()), key=lambda g: -g[2])


def other_note(ctx: Context, curves: "CategoryCurves", event: int, peak_bytes: int) -> list[str]:
    """The note on what 'other' still holds at the peak, where it is more than OTHER_NOTE_SHARE of it."""
    groups = other_groups(ctx, curves.codes, event)
    total = sum(g[2] for g in groups)
    if not peak_bytes or total <= OTHER_NOTE_SHARE * peak_bytes:
        return []
    parts = [f"{format_bytes(b)} in {c} block{'s' if c > 1 else ''} {w}" for w, c, b in groups[:OTHER_GROUPS]]
    rest = groups[OTHER_GROUPS:]
    if rest:
        parts.append(f"{format_bytes(sum(g[2] for g in rest))} in {sum(g[1] for g in rest)} more")
    return [f"other holds {100 * total / peak_bytes:.0f} % of the peak ({format_bytes(total)}): " + "; ".join(parts)]


def readings_note(curves: "CategoryCurves") -> list[str]:
    """What the rules for blocks made before the recording named, and how sure each is: one sentence per
    rule (a rule that named several categories gives their figures together)."""
    by_rule: dict[str, list] = {}
    for r in curves.readings:
        by_rule.setdefault(r.rule, []).append(r)
    parts = []
    for rs in by_rule.values():
        what = " and ".join(f"{CATEGORY_NAMES[r.category]} {format_bytes(r.bytes)} ({r.blocks} blocks)" for r in rs)
        why = "; ".join(dict.fromkeys(r.evidence for r in rs))
        parts.append(f"{what}, confidence {rs[0].confidence:.2f}: {why}")
    return ["made before the recording, named by what the trace shows happening to them: " + "; ".join(parts)] if parts else []
