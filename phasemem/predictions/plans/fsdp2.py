"""FSDP2 (``fully_shard`` per layer and at the root) as a change of a one-GPU trace's blocks: the rank's
shards, each layer gathered while it runs, its all-gather and reduce-scatter buffers; and the same job
at another world size from one rank's trace."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...analysis.core import Analysis
from ...analysis.roles import R, roles
from ...units import format_bytes
from ...vocab import C, P
from ..blocks import Facts
from ..remedies.checkpointing import MIN_BLOCKS, _layer_period, _layer_rows
from .blocks import PlanChange
from .params import MIN_LAYERS, StepBlocks, by_size, dtype_bytes, params_from_table, round_block, shard_bytes
from .precision import half_compute


def _group_ends(f: Facts, s: StepBlocks) -> dict[int, int]:
    """Backward: the event at which each layer's gradients are reduced (the first gradient of the
    next layer backward reaches, or backward's end), by layer in backward order (0: the last layer)."""
    assert s.backward is not None  # fsdp2() passes only steps that ran backward
    ends = {}
    g, grp = s.grads, s.grad_group
    for k in np.unique(grp[grp >= 0]):
        last = np.flatnonzero(grp == k)[-1]
        ends[int(k)] = int(f.alloc[g[last + 1]]) if last + 1 < len(g) else s.backward[1]
    return ends


def _forward_windows(f: Facts, s: StepBlocks, layers: int) -> tuple[list[tuple[int, int]], bool] | None:
    """Each layer's forward, in forward order: from the saved activations' repeated rows (the first
    block of each row), else the forward split evenly (False)."""
    if s.forward is None:
        return None
    a, b = s.forward
    idx = f.made_in(a, b + 1)
    saved = idx[(f.cat[idx] == C["activation"]) & (f.phase_free[idx] == P["backward"])]
    period = _layer_period(f.size[saved]) if len(saved) >= 2 * MIN_BLOCKS else None
    if period is not None:
        start, rows = _layer_rows(f.size[saved], period)
        if rows == layers:
            firsts = f.alloc[saved[start:start + rows * period:period]]
            tail = start + rows * period
            ends = np.append(firsts[1:], f.alloc[saved[tail]] if tail < len(saved) else b)
            return [(int(x), int(y)) for x, y in zip(firsts, ends)], True
    edges = np.linspace(a, b, layers + 1).astype(np.int64)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(layers)], False


def _root_backward_start(f: Facts, s: StepBlocks, step: int) -> int:
    """Where FSDP2 gathers the root's parameters again in backward: when backward reaches the root
    module's output. With the loss outside the model (a loss phase of its own), after the loss's
    backward: just before the first gradient (the head's); else at backward's start."""
    assert s.backward is not None  # fsdp2() passes only steps that ran backward
    loss, _ = f.runs(step, "loss")
    if len(loss) and len(s.grads):
        return max(int(f.alloc[s.grads[0]]) - 1, s.backward[0])
    return s.backward[0]


@dataclass
class _Layers:
    """The parameters' bytes per layer (forward order) and the root's, whole and as one rank's shard."""

    count: int
    whole: np.ndarray
    shard: np.ndarray
    root_whole: int
    root_shard: int

    @classmethod
    def of(cls, params, ranks: int) -> "_Layers":
        g, L = params.group, params.layers
        shard = shard_bytes(params.bytes, params.rows, ranks)
        per = lambda w: np.bincount(g[g >= 0], weights=w[g >= 0], minlength=L).astype(np.int64)  # noqa: E731
        return cls(L, per(params.bytes), per(shard), int(params.bytes[g < 0].sum()), int(shard[g < 0].sum()))


def fsdp2(f, steps, params, ranks, rank, st, ch, add) -> list[str] | str:
    L = params.layers
    if L < MIN_LAYERS:
        return "no stack of layers: FSDP2 shards layer by layer, and no repeated block of parameters was found"
    elt, pd = params.element_bytes, st.get("param_dtype")
    if pd is not None and elt is None:
        return ("the trace does not say the parameters' dtype (record with instrument(), which keeps it), so their "
                f"size in {pd} cannot be told")
    ratio = (dtype_bytes(pd) / elt) if pd is not None else 1.0
    raf = st.get("reshard_after_forward", True)
    layers = _Layers.of(params, ranks)
    _shards(f, params, ranks, ch)
    notes = [half_compute(f, params, steps, ch, st)] if ratio < 1.0 else []
    evenly = False
    for i, s in enumerate(steps):
        if s.backward is None or not len(s.grads):
            continue
        ends = _group_ends(f, s)
        if len(ends) != L:
            continue
        order = [ends[k] for k in range(L)]  # backward order
        evenly |= _gathered(f, s, i, layers, order, ratio, raf, add)
        _reduced(f, s, layers, order, ratio, ch, add)
    notes.insert(0, f"FSDP2 over {L} layers and the root ({format_bytes(layers.root_whole)} of the root's own "
                 f"parameters): each rank keeps 1/{ranks} of the parameters, gradients and optimizer state; a layer's "
                 "parameters are gathered whole while it runs forward and backward"
                 + (" (kept from forward to backward: reshard_after_forward=False)" if not raf else ""))
    if pd is not None:
        notes.append(f"parameters gathered in {pd}: {ratio:g} x their size in the trace")
    if evenly:
        notes.append("the layers' forward could not be told apart by their saved activations: each layer's forward is "
                     "taken as an even share of the forward")
    return notes


def _shards(f: Facts, params, ranks: int, ch) -> None:
    """The rank's shards in place of the whole: parameters, optimizer state, the update's temporaries and
    gradients kept from before the trace (a block of no parameter's size: its bytes over N)."""
    shard = shard_bytes(params.bytes, params.rows, ranks)
    blocks = [np.flatnonzero(f.cat == C["parameter"]), np.flatnonzero(f.cat == C["optimizer_state"]),
              f.members("optimizer_temporaries"), np.flatnonzero((f.cat == C["gradient"]) & (f.alloc < 0))]
    for b in blocks:
        if len(b):
            hit, sh = by_size(f.size[b], params, shard)
            ch.size[b] = np.where(hit, sh, round_block(-(-f.size[b] // ranks)))


def _gathered(f: Facts, s: StepBlocks, step: int, layers: _Layers, order: list[int], ratio: float, raf: bool,
              add) -> bool:
    """One step's gathered parameters and all-gather buffers; True where the layers' forward was split evenly.
    Forward: the root's for the whole forward, each layer's while it runs, a layer's all-gather buffer
    until the next layer's gather is issued. Backward (reshard_after_forward): the root's again from where
    backward reaches the model's output, each layer's prefetched while the one after it runs."""
    assert s.backward is not None  # fsdp2() passes only steps that ran backward
    L = layers.count
    unsh = lambda b: int(round_block(int(round(b * ratio))))  # noqa: E731
    found = _forward_windows(f, s, L)
    fw0, fw1 = s.forward if s.forward else (s.backward[0], s.backward[0])
    bw1 = s.backward[1]
    wins, seen = found if found else ([(fw0, fw0)] * L, False)
    root0 = _root_backward_start(f, s, step)
    add.add(fw0, fw1 if raf else bw1, unsh(layers.root_whole), "unsharded_parameters")
    add.add(fw0, wins[0][0] + 1, unsh(layers.root_whole), "all_gather_buffers")
    for j in range(L):
        nxt = wins[j + 1][0] + 1 if j + 1 < L else fw1
        add.add(wins[j][0], nxt, unsh(layers.whole[j]), "all_gather_buffers")
        add.add(wins[j][0], wins[j][1] if raf else order[L - 1 - j], unsh(layers.whole[j]), "unsharded_parameters")
    if raf:
        add.add(root0, bw1, unsh(layers.root_whole), "unsharded_parameters")
        add.add(root0, root0 + 1, unsh(layers.root_whole), "all_gather_buffers")
        starts = [root0] + order[:-1]
        for k in range(L):
            j = L - 1 - k
            add.add(starts[k], order[k], unsh(layers.whole[j]), "unsharded_parameters")
            add.add(starts[k - 1] if k else root0, starts[k] + 1, unsh(layers.whole[j]), "all_gather_buffers")
    return not seen


def _reduced(f: Facts, s: StepBlocks, layers: _Layers, order: list[int], ratio: float, ch, add) -> None:
    """One step's gradients: each layer's reduced (and freed) when backward leaves the layer, the rank's
    shard of them kept in one block until they are released, the reduce-scatter input until the next."""
    assert s.backward is not None  # fsdp2() passes only steps that ran backward
    L, bw1 = layers.count, s.backward[1]
    g, grp = s.grads, s.grad_group
    if ratio != 1.0:
        ch.size[g] = round_block(np.round(f.size[g] * ratio).astype(np.int64))
    for k in range(L):
        mine = g[grp == k]
        add.add(order[k], int(f.free[mine].max()), int(layers.shard[L - 1 - k]), "sharded_gradients")
        add.add(order[k], order[k + 1] if k + 1 < L else bw1, int(round_block(layers.whole[L - 1 - k])),
                "reduce_scatter_buffers")
        ch.free[mine] = np.minimum(ch.free[mine], order[k])
    root = g[grp < 0]
    if len(root):
        ch.free[root] = np.minimum(ch.free[root], bw1)
        add.add(bw1, int(f.free[root].max()), layers.root_shard, "sharded_gradients")


def from_rank(an: Analysis, f: Facts, name: str, ranks: int, world: int, param_dtype, reshard_after_forward):
    """From one rank's trace of an FSDP2 job of ``world`` ranks, the same job at ``ranks``: each
    shard (parameters, optimizer state, a layer's reduced gradients) takes its size at the new world
    size; the gathered layers, the buffers and the activations stay as the trace has them."""
    table = (an.trace.meta or {}).get("parameters")
    params = params_from_table(table) if table else None
    if params is None:
        return (f"the trace is rank {an.trace.meta.get('rank')} of {world}: a plan at another world size is read "
                "from its parameters' shapes, which instrument() records and this trace does not have")
    # each step's backward taken to run to the trace's end: only the roles' codes are read here
    found = roles(an.trace, an.timeline, an.labels, an.step_of,
                  np.full(len(an.segmentation.steps), len(an.trace), np.int64))
    if name != "fsdp2" or found.wrapper != "fsdp2" or not found.known():
        return (f"the trace is one rank of a {world}-rank job ({found.wrapper or 'its wrapper unknown'}): only the "
                "same FSDP2 job at another world size is predicted from it; other plans are read from a one-GPU trace")
    if param_dtype is not None or not reshard_after_forward:
        return "from one rank's trace, the plan keeps the job's own settings (param_dtype, reshard_after_forward)"
    ch = f.change("")
    old, new = shard_bytes(params.bytes, params.rows, world), shard_bytes(params.bytes, params.rows, ranks)
    L = params.layers
    g = params.group
    lay_old = np.bincount(g[g >= 0], weights=old[g >= 0], minlength=L).astype(np.int64)
    lay_new = np.bincount(g[g >= 0], weights=new[g >= 0], minlength=L).astype(np.int64)
    root_old, root_new = int(old[g < 0].sum()), int(new[g < 0].sum())
    sizes = dict(zip(old.tolist(), new.tolist()))
    for cat in ("parameter", "optimizer_state"):
        blocks = np.flatnonzero(f.cat == C[cat])
        for i in blocks:
            if int(f.size[i]) in sizes:
                ch.size[i] = sizes[int(f.size[i])]
    grads = np.flatnonzero(found.codes == R["sharded_gradients"])
    lay = dict(zip(lay_old.tolist(), lay_new.tolist()))
    lay[root_old] = root_new
    for i in grads:
        if int(f.size[i]) in lay:
            ch.size[i] = lay[int(f.size[i])]
    ch.explanation = (f"the same FSDP2 job at {ranks} ranks, from rank {an.trace.meta.get('rank')} of {world}: each "
                      "shard at its new size, the gathered layers and the activations as traced")
    ch.added, ch.added_kind = (), None
    return PlanChange(f, ch, np.zeros(0, np.int64), [ch.explanation, "the parameters from the parameter table "
                                                                       "instrument() recorded"], params, None)


