"""What was made before the recording, named by what the trace shows happening to it, for categories.py:
state an optimizer frees and replaces every step, gradients backward adds into, and the weights beside them.
The rules and the traces that set them: docs/categories.md."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..vocab import CATEGORIES, C, P
from .facts import Context
from .spans import backward_resumed, run_of_events


@dataclass(frozen=True)
class Reading:
    """Blocks from before the recording that one rule named: which category, how many, how sure, and why.

    Example:
        >>> [(r.rule, r.category, r.bytes) for r in report.analysis.categories.readings]
        [('state_rebound', 'optimizer_state', 1524629504)]
    """

    rule: str  # "state_rebound" | "gradients_accumulated"
    category: str
    blocks: int
    bytes: int
    confidence: float
    evidence: str


#: How sure each rule is: the share of the bytes it named that the programs confirm, 1.0 on each trace
#: where it fires (wild/bcrafton_cs336, wild/wedsonlin_medium512_train, wild/magma27_cs336: the models'
#: bytes from their sources), lowered for how few traces that is, and for the pairs whose weight and
#: gradient the trace cannot tell apart block by block (docs/accuracy.md).
CONFIDENCE = {"state_rebound": 0.95, "gradients_accumulated": 0.9}

#: A rule names blocks only where the sizes that agree with it hold at least this share of the bytes it
#: could name (the kept blocks from before the recording, or the ones the optimizer frees): a frozen
#: copy, a cache or a pool beside them leaves the whole reading unsaid. wild/bcrafton_cs336 and
#: wild/magma27_cs336: 99.9 % (their inputs and a 16 KiB block are the rest).
AGREEING_SHARE = 0.9


def name_before(ctx: Context, pre_cat: np.ndarray, cat: np.ndarray, workspace: np.ndarray,
                gradient_sizes: np.ndarray, trains: bool) -> list[Reading]:
    """Rename (in place) the blocks from before the recording that the trace shows to be gradients
    kept from an earlier step with their weights, or optimizer state the optimizer rebinds; the
    readings say what was named. ``workspace`` marks the pre-existing blocks a workspace getter made,
    ``gradient_sizes`` are the sizes of the busiest step's gradients (empty when none was found)."""
    life = ctx.timeline.lifetimes
    pre = np.flatnonzero(life.preexisting)
    size, free = life.size[pre], life.free_event[pre]
    readings = []
    counts = None  # parameters per size: from the gradients, or from what backward adds
    if len(gradient_sizes):
        counts = dict(zip(*(u.tolist() for u in np.unique(gradient_sizes, return_counts=True))))
    elif trains:
        counts, got = _accumulated(ctx, pre_cat, size, free, workspace)
        readings += got
    if counts:
        readings += _rebound(ctx, pre_cat, cat, size, free, workspace, counts)
    return readings


def _accumulated(ctx: Context, pre_cat, size, free, workspace) -> tuple[dict, list[Reading]]:
    """Gradients kept from before the recording that backward adds into (no zero_grad, or
    ``zero_grad(set_to_none=False)``): no backward keeps a block, yet each backward pass makes and frees
    one block of each weight's size (autograd's ``grad += new_grad``), and the blocks alive all along
    come, size by size, in that many weights, as many gradients and a whole number of states each."""
    n = ctx.n
    kept = (free >= n) & ~workspace
    if not kept.any() or len(backward_resumed(ctx.seg.labels, ctx.seg.step_of)):
        return {}, []  # an update inside backward frees each gradient itself: its state pairs the same way
    complete = np.array([bool(s[2]) for s in ctx.seg.steps] + [False])
    runs = np.flatnonzero((ctx.run_phase == P["backward"]) & (ctx.run_step >= 0)
                          & complete[np.where(ctx.run_step >= 0, ctx.run_step, len(complete) - 1)])
    if not len(runs):
        return {}, []
    # made and freed in one backward run, of a size kept from before the recording
    run_of = run_of_events(ctx.run_first, n)
    a, f = ctx.alloc, ctx.free
    r = run_of[a]
    sizes = np.unique(size[kept])
    made = (f < n) & (r == run_of[np.minimum(f, n - 1)]) & np.isin(r, runs) & np.isin(ctx.size, sizes)
    # per (run, size) counts, every backward run giving each size the same count
    rk = np.searchsorted(runs, r[made])
    zk = np.searchsorted(sizes, ctx.size[made])
    table = np.zeros((len(runs), len(sizes)), np.int64)
    np.add.at(table, (rk, zk), 1)
    per = table[0]
    same = (table == per).all(axis=0) & (per > 0)
    have = np.bincount(np.searchsorted(sizes, size[kept]), minlength=len(sizes))
    k = np.where(same, have // np.maximum(per, 1) - 2, -1)
    whole = same & (have % np.maximum(per, 1) == 0) & (k >= 0)
    if not whole.any():
        return {}, []
    weight = sizes * have
    # the number of states per weight: the one the most bytes agree on
    ks = np.unique(k[whole])
    k0 = int(ks[np.argmax([weight[whole & (k == x)].sum() for x in ks])])
    agree = whole & (k == k0)
    if weight[agree].sum() < AGREEING_SHARE * weight.sum():
        return {}, []
    state_ok = k0 == 0 or _has_optimizer(ctx)
    counts = {int(z): int(c) for z, c in zip(sizes[agree], per[agree])}
    # by size, in address order: the weights first, then the gradients, then the state (which block of
    # a size is which the trace cannot tell; all live the whole trace, so the bytes are exact)
    idx = np.flatnonzero(kept & np.isin(size, sizes[agree]))
    idx = idx[np.argsort(size[idx], kind="stable")]
    srt = size[idx]
    rank = np.arange(len(idx)) - np.searchsorted(srt, srt, "left")
    nz = per[np.searchsorted(sizes, srt)]
    name = np.where(rank < nz, C["parameter"], np.where(rank < 2 * nz, C["gradient"], C["optimizer_state"]))
    if not state_ok:
        name[rank >= 2 * nz] = C["other"]
    pre_cat[idx] = name
    return counts, _accumulated_readings(name, srt, k0)


def _accumulated_readings(name: np.ndarray, srt: np.ndarray, k0: int) -> list[Reading]:
    """_accumulated's readings from the codes it gave the blocks (``name``, their sizes ``srt``) and the
    number of states per weight ``k0``."""
    readings = []
    how = ("kept all along, a weight and its gradient per pair of blocks of one size: each backward pass makes and "
           "frees one block per pair (autograd adding the new gradient into the kept one: no zero_grad, or "
           "zero_grad(set_to_none=False)); which block of a pair is the weight the trace cannot tell, the bytes it can")
    for code in (C["parameter"], C["gradient"]):
        m = name == code
        readings.append(Reading("gradients_accumulated", CATEGORIES[code], int(m.sum()), int(srt[m].sum()),
                                CONFIDENCE["gradients_accumulated"], how))
    m = name == C["optimizer_state"]
    if m.any():
        readings.append(Reading("gradients_accumulated", "optimizer_state", int(m.sum()), int(srt[m].sum()),
                                CONFIDENCE["gradients_accumulated"],
                                f"{k0} more blocks of each pair's size, kept all along beside an optimizer step: "
                                f"its state, updated in place"))
    return readings


def _rebound(ctx: Context, pre_cat, cat, size, free, workspace, counts: dict) -> list[Reading]:
    """Optimizer state rebound every step (a hand-written AdamW's ``state["m"] = m_t``): blocks from before
    the recording that an optimizer step frees, each replaced in that step by a block of its size that the
    step keeps (the new state), a whole number per weight of that size, while the weights stay."""
    n = ctx.n
    at = np.minimum(free, n - 1)
    cand = np.flatnonzero((free < n) & ~workspace & (ctx.seg.labels[at] == P["optimizer"]) & (pre_cat == C["other"]))
    if not len(cand):
        return []
    step = ctx.seg.step_of[at[cand]].astype(np.int64)
    # what each step's optimizer made and kept past the step (categories._own: optimizer state)
    new = (ctx.phase_at_alloc == P["optimizer"]) & (cat == C["optimizer_state"])
    width = int(max(size.max(), ctx.size.max() if len(ctx.size) else 0)) + 1
    have = dict(zip(*(u.tolist() for u in np.unique(ctx.step_at_alloc[new] * width + ctx.size[new],
                                                       return_counts=True))))
    need = dict(zip(*(u.tolist() for u in np.unique(step * width + size[cand], return_counts=True))))
    replaced = {key for key, c in need.items() if have.get(key, 0) >= c}
    ok = np.isin(step * width + size[cand], np.array(sorted(replaced), np.int64)) & (step >= 0)
    # the weights of those sizes are still there (an optimizer that rebinds the weights frees them too)
    weights = dict(zip(*(u.tolist() for u in np.unique(size[(free >= n) & (pre_cat == C["parameter"])],
                                                       return_counts=True))))
    z = size[cand]
    sizes, freed = np.unique(z, return_counts=True)
    per = np.array([counts.get(int(s), 0) for s in sizes])
    full = np.array([int(ok[z == s].sum()) == c for s, c in zip(sizes, freed)])
    stay = np.array([weights.get(int(s), 0) >= c for s, c in zip(sizes, per)])
    k = np.where(per > 0, freed // np.maximum(per, 1), 0)
    whole = full & stay & (per > 0) & (freed % np.maximum(per, 1) == 0) & (k >= 1)
    if not whole.any():
        return []
    weight = sizes * freed
    ks = np.unique(k[whole])
    k0 = int(ks[np.argmax([weight[whole & (k == x)].sum() for x in ks])])
    agree = whole & (k == k0)
    if weight[agree].sum() < AGREEING_SHARE * weight.sum():
        return []
    named = cand[np.isin(z, sizes[agree])]
    pre_cat[named] = C["optimizer_state"]
    return [Reading("state_rebound", "optimizer_state", len(named), int(size[named].sum()), CONFIDENCE["state_rebound"],
                    f"an optimizer step frees each and keeps a new block of its size, {k0} per weight of those "
                    f"sizes, the weights staying: last step's state, which the optimizer replaces every step (as "
                    f"state['m'] = m_t does)")]


def _has_optimizer(ctx: Context) -> bool:
    return bool((ctx.seg.labels == P["optimizer"]).any() or any(iv.phase == "optimizer" for iv in ctx.seg.intervals))

