"""The parameters as a plan reads them off a trace (instrument()'s table, else one gradient block per
parameter), the layers they form, and a rank's share of them: ZeRO's partition, FSDP2's shards."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...analysis.core import Analysis
from ...errors import PhasememError
from ...vocab import C, P
from ..blocks import Facts

#: Element sizes of the dtypes ``param_dtype`` takes.
DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
               "half": 2, "float64": 8, "fp64": 8}
#: The caching allocator rounds every block up to this (torch's kMinBlockSize).
BLOCK_ROUND = 512
#: A stack of layers repeats its gradients' sizes at least this many times (fewer: no layers to shard).
MIN_LAYERS = 2


@dataclass
class Params:
    """The parameters as a plan sees them: bytes in the trace's dtype, rows (dim 0, 0 unknown), the
    layer each belongs to (-1: the root module's own), and where this was read."""

    bytes: np.ndarray
    rows: np.ndarray
    group: np.ndarray
    trainable: np.ndarray
    element_bytes: int | None
    source: str

    @property
    def layers(self) -> int:
        return int(self.group.max()) + 1 if len(self.group) else 0


def dtype_bytes(dtype) -> int:
    name = str(dtype).replace("torch.", "").lower()
    if name not in DTYPE_BYTES:
        raise PhasememError(f"unknown param_dtype {dtype!r}: give one of bf16, fp16, fp32")
    return DTYPE_BYTES[name]


def round_block(nbytes) -> np.ndarray:
    b = np.asarray(nbytes, np.int64)
    return np.where(b > 0, (b + BLOCK_ROUND - 1) // BLOCK_ROUND * BLOCK_ROUND, 0)


# -- the parameters --------------------------------------------------------------------------------
def _layer_of(names: list[str]) -> np.ndarray:
    """Each name's layer: the child of a numbered container (``blocks.3.attn.w`` -> blocks.3), in the
    order met; -1 for a name in no numbered container (the root module's own)."""
    keys: dict[str, int] = {}
    out = np.full(len(names), -1, np.int64)
    for i, name in enumerate(names):
        parts = name.split(".")
        for j, part in enumerate(parts[:-1]):
            if part.isdigit() and j > 0:
                out[i] = keys.setdefault(".".join(parts[:j + 1]), len(keys))
                break
    return out


def params_from_table(table: list) -> Params | None:
    rows = [r for r in table if isinstance(r, (list, tuple)) and len(r) >= 3 and not str(r[0]).startswith("optimizer.")]
    if not rows:
        return None
    names = [str(r[0]) for r in rows]
    shapes = [list(r[1]) for r in rows]
    elt = [DTYPE_BYTES.get(str(r[2]), 0) for r in rows]
    numel = np.array([int(np.prod(s)) if s else 1 for s in shapes], np.int64)
    nbytes = numel * np.array(elt, np.int64)
    dims = np.array([int(s[0]) if s else 1 for s in shapes], np.int64)
    trainable = np.array([bool(r[3]) if len(r) > 3 else True for r in rows])
    sizes = {e for e, t in zip(elt, trainable) if t and e}
    return Params(nbytes, dims, _layer_of(names), trainable, sizes.pop() if len(sizes) == 1 else None,
                  "the parameter table instrument() recorded")


def period_of(sizes: np.ndarray) -> tuple[int, int, int] | None:
    """(start, period, repeats) of the longest stretch of ``sizes`` that repeats a period at least
    MIN_LAYERS times: a stack of identical layers; None where nothing repeats."""
    best = None
    n = len(sizes)
    for p in range(1, n // MIN_LAYERS + 1):
        same = np.concatenate([[False], sizes[p:] == sizes[:-p], [False]])
        edges = np.flatnonzero(np.diff(same.astype(np.int8)))
        if not len(edges):
            continue
        starts, ends = edges[::2], edges[1::2]
        k = int(np.argmax(ends - starts))
        run = int(ends[k] - starts[k])
        reps = (run + p) // p
        if reps < MIN_LAYERS:
            continue
        covered = reps * p
        if best is None or covered > best[0]:
            best = (covered, int(starts[k]), p, reps)
    return best[1:] if best else None


def groups_of(sizes: np.ndarray) -> np.ndarray | None:
    """Each block's layer (-1: none) from the sizes' repeats (``period_of``), in the order given."""
    found = period_of(sizes)
    if found is None:
        return None
    start, p, reps = found
    g = np.full(len(sizes), -1, np.int64)
    g[start:start + reps * p] = np.arange(reps * p) // p
    return g


# -- what a step shows ---------------------------------------------------------------------------
@dataclass
class StepBlocks:
    """One step's gradient blocks (Lifetimes order, as backward made them) with their layer, and the
    first and last events of its forward and backward."""

    grads: np.ndarray
    grad_group: np.ndarray
    forward: tuple[int, int] | None
    backward: tuple[int, int] | None
    optimizer: tuple[int, int] | None


def _span(f: Facts, step: int, phase: str) -> tuple[int, int] | None:
    first, last = f.runs(step, phase)
    return (int(first.min()), int(last.max())) if len(first) else None


def step_blocks(f: Facts) -> list[StepBlocks]:
    out = []
    grads = np.flatnonzero((f.cat == C["gradient"]) & (f.alloc >= 0) & (f.phase_alloc == P["backward"]))
    grads = grads[np.argsort(f.alloc[grads], kind="stable")]
    for s in range(len(f.an.segmentation.steps)):
        bw = _span(f, s, "backward")
        if bw is None:
            out.append(StepBlocks(np.zeros(0, np.int64), np.zeros(0, np.int64), _span(f, s, "forward"), None,
                                  _span(f, s, "optimizer")))
            continue
        lo, hi = np.searchsorted(f.alloc[grads], [bw[0], bw[1] + 1])
        g = grads[lo:hi]
        grp = groups_of(f.size[g])
        out.append(StepBlocks(g, grp if grp is not None else np.full(len(g), -1, np.int64),
                              _span(f, s, "forward"), bw, _span(f, s, "optimizer")))
    return out


def params_of(an: Analysis, f: Facts, steps: list[StepBlocks]) -> Params | str:
    """The parameters from instrument()'s table, else from a step's gradients (the step with the most)."""
    table = (an.trace.meta or {}).get("parameters") if isinstance(an.trace.meta, dict) else None
    if table:
        got = params_from_table(table)
        if got is not None:
            return got
    best = max(steps, key=lambda s: len(s.grads), default=None)
    if best is None or not len(best.grads):
        return "no gradients in the trace: which blocks are parameters, and their sizes, cannot be told"
    sizes = f.size[best.grads].astype(np.int64)
    g = best.grad_group.copy()
    g[g >= 0] = g.max() - g[g >= 0]  # backward meets the last layer first: numbered in forward order
    return Params(sizes, np.zeros(len(sizes), np.int64), g, np.ones(len(sizes), bool), None,
                  "the gradients backward made (one block per parameter)")


# -- shares ----------------------------------------------------------------------------------------
def zero_owner(nbytes: np.ndarray, ranks: int) -> np.ndarray:
    """Each parameter's rank under ZeroRedundancyOptimizer's partition: largest first (a stable sort
    by size), each to the rank holding the fewest bytes so far (the lowest rank on a tie)."""
    order = np.argsort(-nbytes, kind="stable")
    held = np.zeros(ranks, np.int64)
    owner = np.empty(len(nbytes), np.int64)
    for i in order:
        r = int(np.argmin(held))
        owner[i] = r
        held[r] += nbytes[i]
    return owner


def shard_bytes(nbytes: np.ndarray, rows: np.ndarray, ranks: int) -> np.ndarray:
    """A parameter's shard on rank 0 under FSDP2: dim 0 split in ``ranks`` equal parts, padded
    (ceil(rows / N) rows); with rows unknown, the bytes over N."""
    nbytes = np.asarray(nbytes, np.int64)
    rows = np.asarray(rows, np.int64)
    known = rows > 0
    per_row = np.where(known, nbytes // np.maximum(rows, 1), 0)
    padded = -(-rows // ranks) * per_row
    return round_block(np.where(known, padded, -(-nbytes // ranks)))

def by_size(sizes: np.ndarray, params: Params, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(matched, value) for each block size: the value of the first parameter of that size."""
    order = np.argsort(params.bytes, kind="stable")
    ps = params.bytes[order]
    pos = np.minimum(np.searchsorted(ps, sizes), max(len(ps) - 1, 0))
    hit = (ps[pos] == sizes) if len(ps) else np.zeros(len(sizes), bool)
    return hit, values[order][pos] if len(ps) else np.zeros(len(sizes), np.int64)


def owned_share(blocks: np.ndarray, f: Facts, params: Params, owned: np.ndarray) -> np.ndarray:
    """Of ``blocks`` (one per parameter of a size, as optimizer state or gradients are), those a rank
    keeps: for each size, as many as it owns parameters of that size (the first ones); a block of no
    parameter's size is kept with the share of bytes the rank owns (its size scaled)."""
    keep = np.zeros(len(blocks), np.float64)
    sizes = f.size[blocks]
    train = params.trainable
    total = int(params.bytes[train].sum()) or 1
    share = float(params.bytes[train & owned].sum()) / total
    psz, pn = np.unique(params.bytes[train], return_counts=True)
    osz, on = np.unique(params.bytes[train & owned], return_counts=True)
    own_of = dict(zip(osz.tolist(), on.tolist()))
    n_of = dict(zip(psz.tolist(), pn.tolist()))
    for s in np.unique(sizes):
        idx = np.flatnonzero(sizes == s)
        if int(s) in n_of:
            k = int(round(len(idx) * own_of.get(int(s), 0) / n_of[int(s)]))
            keep[idx[:k]] = 1.0
        else:
            keep[idx] = share
    return keep


