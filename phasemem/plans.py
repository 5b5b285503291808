"""Parallel plans as what-ifs: what rank r of an N-rank job would hold under DDP, ZeRO-1/2 or FSDP2,
replayed on a one-GPU trace. The parameters, their gradients and the optimizer's state are resized to
a rank's share; the wrapper's own buffers (DDP's buckets, FSDP2's unsharded layers, all-gather and
reduce-scatter buffers) are added where the trace shows when they would live. The reasoning and the
measurements are in docs/plans.md.

Example:
    >>> p = plan(report.analysis, report.patterns, "fsdp2", ranks=8, param_dtype="bf16")
    >>> p.applies, p.predicted_peak_bytes, p.categories
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

import numpy as np

from .analysis import Analysis
from .errors import PhasememError
from .model import Pattern
from .remedy_facts import Change, Facts
from .scaling import CONSTANT, QUADRATIC
from .units import format_bytes
from .vocab import C, CATEGORIES, P, PHASES

#: The plans, by name: what ``--plan NAME:N`` and ``report.plan(NAME, ranks=N)`` take.
PLANS = ("ddp", "zero1", "zero2", "fsdp2")
#: Element sizes of the dtypes ``param_dtype`` takes.
DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
               "half": 2, "float64": 8, "fp64": 8}
#: The caching allocator rounds every block up to this (torch's kMinBlockSize).
BLOCK_ROUND = 512
#: DDP's buckets: the first holds at most 1 MiB, the others 25 MiB (torch's defaults).
DDP_FIRST_BUCKET, DDP_BUCKET = 1 << 20, 25 << 20
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


@dataclass
class Plan:
    """A parallel plan replayed on the trace: what rank ``rank`` of ``ranks`` would hold.

    Example:
        >>> p = report.plan("zero1", ranks=4)
        >>> p.predicted_peak_bytes, p.peak_phase, p.categories["optimizer_state"]
    """

    plan: str
    ranks: int
    rank: int
    applies: bool
    why: list[str] = field(default_factory=list)
    predicted_peak_bytes: int | None = None
    peak_phase: str | None = None
    peak_step: int | None = None
    phase_peaks: dict[str, int] = field(default_factory=dict)
    categories: dict[str, int] = field(default_factory=dict)  # at the predicted peak
    wrapper: dict[str, int] = field(default_factory=dict)  # the wrapper's own buffers at the predicted peak
    settings: dict = field(default_factory=dict)
    confidence: str = "low"
    explanation: str = ""
    #: Where the trace cannot tell between two readings: the peak under the lower one (else None).
    predicted_peak_bytes_low: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return format_plan(self)


def parse_plan(text: str) -> tuple[str, int]:
    """``"fsdp2:8"`` -> ("fsdp2", 8); a one-line error otherwise."""
    m = re.fullmatch(r"\s*([a-z0-9_]+)\s*(?::\s*(\d+))?\s*", text or "")
    if not m or m.group(1) not in PLANS:
        raise PhasememError(f"unknown plan {text!r}: give one of {', '.join(PLANS)}, with the ranks after a colon "
                            "(fsdp2:8)")
    n = int(m.group(2) or 1)
    if n < 1:
        raise PhasememError(f"plan {text!r}: the ranks must be 1 or more")
    return m.group(1), n


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


def format_plan(p: Plan) -> str:
    from .parallel import ROLE_NAMES
    from .vocab import CATEGORY_NAMES
    head = f"{p.plan} with {p.ranks} rank(s), rank {p.rank}"
    if p.settings:
        head += " (" + ", ".join(f"{k}={v}" for k, v in p.settings.items()) + ")"
    if not p.applies:
        return f"{head}: cannot tell: {'; '.join(p.why)}"
    peak = format_bytes(p.predicted_peak_bytes)
    if p.predicted_peak_bytes_low is not None:
        peak = f"{format_bytes(p.predicted_peak_bytes_low)} to {peak}"
    cats = ", ".join(f"{CATEGORY_NAMES.get(k, k)} {format_bytes(v)}" for k, v in p.categories.items() if v)
    wrap = ", ".join(f"{ROLE_NAMES.get(k, k)} {format_bytes(v)}" for k, v in p.wrapper.items() if v)
    lines = [f"{head}: peak {peak} in {p.peak_phase} (confidence {p.confidence})",
             f"    at the peak: {cats}" + (f"; of which the wrapper's own: {wrap}" if wrap else "")]
    lines += [f"    - {w}" for w in p.why]
    return "\n".join(lines)


__all__ = ["PLANS", "Plan", "Params", "parse_plan", "zero_owner", "shard_bytes", "period_of", "groups_of",
           "params_of", "step_blocks", "dtype_bytes", "format_plan", "Change", "CONSTANT", "CATEGORIES", "PHASES"]


# -- the changes -----------------------------------------------------------------------------------
#: Which category each of the wrapper's own blocks counts as in a plan's categories.
ROLE_CATEGORY = {"ddp_buckets": "gradient", "unsharded_parameters": "parameter", "all_gather_buffers": "parameter",
                 "reduce_scatter_buffers": "gradient", "sharded_gradients": "gradient"}
ROLES = tuple(ROLE_CATEGORY)


class Added:
    """Blocks a plan adds: alloc event, free event, size, role (a ROLES position)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, int]] = []

    def add(self, alloc: int, free: int, size: int, role: str) -> None:
        if size > 0 and free > alloc:
            self.rows.append((int(alloc), int(free), int(size), ROLES.index(role)))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if not self.rows:
            z = np.zeros(0, np.int64)
            return z, z, z, z
        a = np.array(self.rows, np.int64)
        return a[:, 0], a[:, 1], a[:, 2], a[:, 3]


def _by_size(sizes: np.ndarray, params: Params, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(matched, value) for each block size: the value of the first parameter of that size."""
    order = np.argsort(params.bytes, kind="stable")
    ps = params.bytes[order]
    pos = np.minimum(np.searchsorted(ps, sizes), max(len(ps) - 1, 0))
    hit = (ps[pos] == sizes) if len(ps) else np.zeros(len(sizes), bool)
    return hit, values[order][pos] if len(ps) else np.zeros(len(sizes), np.int64)


def _owned_share(blocks: np.ndarray, f: Facts, params: Params, owned: np.ndarray) -> np.ndarray:
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


def _ddp_buckets(params: Params) -> list[int]:
    """DDP's buckets' sizes: the trainable parameters' gradients, in reverse order, filled up to 1 MiB
    for the first bucket and 25 MiB after (a parameter larger than a bucket gets one of its own)."""
    out, cur, cap = [], 0, DDP_FIRST_BUCKET
    for b in params.bytes[params.trainable][::-1]:
        cur += int(b)
        if cur >= cap:
            out.append(cur)
            cur, cap = 0, DDP_BUCKET
    if cur:
        out.append(cur)
    return out


def _grads_of(f: Facts) -> np.ndarray:
    return np.flatnonzero((f.cat == C["gradient"]) & (f.alloc >= 0))


def _ddp(f, steps, params, ranks, rank, st, ch, add) -> list[str]:
    for b in _ddp_buckets(params):
        add.add(-1, f.n, int(round_block(b)), "ddp_buckets")
    total = int(round_block(params.bytes[params.trainable].sum()))
    second = steps[1] if len(steps) > 1 else (steps[0] if steps else None)
    if st.get("rebuild_buckets", True) and second is not None and second.forward is not None:
        end = second.backward[1] if second.backward else second.forward[1]
        if st.get("bucket_view") and len(second.grads):  # the first gradient copied in lets the old set go
            end = int(f.alloc[second.grads[0]])
        add.add(second.forward[0], end, total, "ddp_buckets")
    notes = [f"DDP's buckets hold a copy of every gradient ({format_bytes(total)}), made when the model is wrapped; "
             "after the first iteration DDP builds them again in the order the gradients came, and the first set "
             "may live through the next iteration (torch 2.11): one more copy for that iteration"]
    if st.get("bucket_view"):
        g = _grads_of(f)
        ch.free[g] = np.minimum(ch.free[g], f.alloc[g] + 1)
        notes.append("gradient_as_bucket_view: each gradient is copied into its bucket as soon as it is made, "
                     "and .grad is a view of the bucket")
    return notes


def _optimizer_share(f, params, owned, ch) -> None:
    """ZeRO: only the state (and the update's temporaries) of the parameters a rank owns."""
    state = np.flatnonzero(f.cat == C["optimizer_state"])
    keep = _owned_share(state, f, params, owned)
    ch.size[state] = np.round(f.size[state] * keep).astype(np.int64)
    temps = f.members("optimizer_temporaries")
    if len(temps):
        keep = _owned_share(temps, f, params, owned)
        ch.size[temps] = np.round(f.size[temps] * keep).astype(np.int64)


def _zero(f, steps, params, ranks, rank, st, ch, add, stage: int) -> list[str]:
    owner = zero_owner(np.where(params.trainable, params.bytes, 0), ranks)
    owned = (owner == rank) & params.trainable
    _optimizer_share(f, params, owned, ch)
    mine = int(params.bytes[owned].sum())
    notes = [f"ZeroRedundancyOptimizer gives rank {rank} {int(owned.sum())} of {int(params.trainable.sum())} "
             f"parameters ({format_bytes(mine)}, largest first to the rank holding least): their optimizer state only"]
    if stage == 1:
        notes += _ddp(f, steps, params, ranks, rank, st, ch, add)
        return notes
    for s in steps:  # ZeRO-2: a gradient the rank does not own is reduced and dropped as soon as it is made
        if not len(s.grads):
            continue
        keep = _owned_share(s.grads, f, params, owned) > 0.5
        gone = s.grads[~keep]
        ch.free[gone] = np.minimum(ch.free[gone], f.alloc[gone] + 1)
    notes.append("ZeRO-2: each gradient the rank does not own is freed as soon as it is reduced (DeepSpeed's "
                 "reduce bucket not counted)")
    return notes


#: Half-precision compute under FSDP2's MixedPrecisionPolicy, from a trace in fp32: every block that
#: grows with the tokens is made in the half dtype (this share of its fp32 size), but the vocabulary-sized
#: ones, which the loss upcasts (fixtures/plans gpt, fsdp2_bf16 at N=8: activations 981 -> 687 MiB,
#: the 393 MiB of logits kept).
HALF_COMPUTE = 0.5


def _group_ends(f: Facts, s: StepBlocks) -> dict[int, int]:
    """Backward: the event at which each layer's gradients are reduced (the first gradient of the
    next layer backward reaches, or backward's end), by layer in backward order (0: the last layer)."""
    ends = {}
    g, grp = s.grads, s.grad_group
    for k in np.unique(grp[grp >= 0]):
        last = np.flatnonzero(grp == k)[-1]
        ends[int(k)] = int(f.alloc[g[last + 1]]) if last + 1 < len(g) else s.backward[1]
    return ends


def _forward_windows(f: Facts, s: StepBlocks, layers: int) -> tuple[list[tuple[int, int]], bool] | None:
    """Each layer's forward, in forward order: from the saved activations' repeated rows (the first
    block of each row), else the forward split evenly (False)."""
    from .remedies import MIN_BLOCKS, _layer_period, _layer_rows
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
    loss, _ = f.runs(step, "loss")
    if len(loss) and len(s.grads):
        return max(int(f.alloc[s.grads[0]]) - 1, s.backward[0])
    return s.backward[0]


#: autocast casts every weight once per forward: a trace ran under it where blocks of half the size of
#: at least this share of the large weights' sizes are made in each forward (fixtures/plans' bf16 traces: all).
AUTOCAST_SHARE = 0.8
#: Weights at least this large are the ones checked for their casts (small ones share sizes with much else).
LARGE_WEIGHT = 1 << 20


def autocast_casts(f: Facts, params: Params, steps: list[StepBlocks]) -> np.ndarray | None:
    """The weights' half-precision casts autocast makes in each forward (a mask), or None where the
    trace shows no autocast: for most large weight sizes, as many blocks of half that size made in
    every forward as there are weights of it."""
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
    if not forwards or (hits >= forwards).mean() < AUTOCAST_SHARE:
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


def _half_compute(f: Facts, params: Params, steps: list[StepBlocks], ch: Change, st: dict) -> str:
    """Blocks computed in the half dtype: per-token blocks made in forward, loss or backward halve, but
    the vocabulary-sized ones (upcast for the loss); under autocast, as they are, less its weight casts."""
    from .remedies import block_growth
    casts = autocast_casts(f, params, steps)
    kind = block_growth(f).kind
    if casts is not None:
        ch.size[casts] = 0
        scores = kind == QUADRATIC  # autocast runs softmax in fp32; a half-precision model does not
        ch.size[scores] = np.round(ch.size[scores] * HALF_COMPUTE).astype(np.int64)
        return ("the trace ran under autocast: its per-token blocks are taken as half precision already but the "
                "attention scores (autocast's softmax runs in fp32), and its casts of the weights give way to the "
                "gathered half-precision parameters")
    grows = kind != CONSTANT
    vocab = np.zeros(len(f.size), bool)
    vocab[f.members("logits", "softmax_spike", "logits_release")] = True
    made = np.isin(f.phase_alloc, [P["forward"], P["loss"], P["backward"]])
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


def _fsdp2(f, steps, params, ranks, rank, st, ch, add) -> list[str] | str:
    L = params.layers
    if L < MIN_LAYERS:
        return "no stack of layers: FSDP2 shards layer by layer, and no repeated block of parameters was found"
    elt = params.element_bytes
    pd = st.get("param_dtype")
    if pd is not None and elt is None:
        return ("the trace does not say the parameters' dtype (record with instrument(), which keeps it), so their "
                f"size in {pd} cannot be told")
    ratio = (dtype_bytes(pd) / elt) if pd is not None else 1.0
    raf = st.get("reshard_after_forward", True)
    shard = shard_bytes(params.bytes, params.rows, ranks)
    layer_bytes = np.bincount(params.group[params.group >= 0], weights=params.bytes[params.group >= 0], minlength=L)
    layer_shard = np.bincount(params.group[params.group >= 0], weights=shard[params.group >= 0], minlength=L)
    root_bytes = int(params.bytes[params.group < 0].sum())
    root_shard = int(shard[params.group < 0].sum())
    notes = []
    # the rank's shards in place of the whole: parameters, optimizer state, the update's temporaries
    for cat in ("parameter", "optimizer_state"):
        blocks = np.flatnonzero(f.cat == C[cat])
        hit, sh = _by_size(f.size[blocks], params, shard)
        ch.size[blocks] = np.where(hit, sh, round_block(-(-f.size[blocks] // ranks)))
    temps = f.members("optimizer_temporaries")
    if len(temps):
        hit, sh = _by_size(f.size[temps], params, shard)
        ch.size[temps] = np.where(hit, sh, -(-f.size[temps] // ranks))
    kept = np.flatnonzero((f.cat == C["gradient"]) & (f.alloc < 0))  # gradients kept from before the trace
    if len(kept):
        hit, sh = _by_size(f.size[kept], params, shard)
        ch.size[kept] = np.where(hit, sh, -(-f.size[kept] // ranks))
    if ratio < 1.0:
        notes.append(_half_compute(f, params, steps, ch, st))
    unsh = lambda b: int(round_block(int(round(b * ratio))))  # noqa: E731
    evenly = False
    for i, s in enumerate(steps):
        if s.backward is None or not len(s.grads):
            continue
        ends = _group_ends(f, s)
        if len(ends) != L:
            continue
        found = _forward_windows(f, s, L)
        fw0, fw1 = s.forward if s.forward else (s.backward[0], s.backward[0])
        bw0, bw1 = s.backward
        wins, seen = found if found else ([(fw0, fw0)] * L, False)
        evenly |= not seen
        order = [ends[k] for k in range(L)]  # backward order
        # forward: the root's parameters for the whole forward, each layer's while it runs; a layer's
        # all-gather buffer lives until the next layer's gather is issued
        root0 = _root_backward_start(f, s, i)
        add.add(fw0, fw1 if raf else bw1, unsh(root_bytes), "unsharded_parameters")
        add.add(fw0, wins[0][0] + 1, unsh(root_bytes), "all_gather_buffers")
        for j in range(L):
            nxt = wins[j + 1][0] + 1 if j + 1 < L else fw1
            add.add(wins[j][0], nxt, unsh(layer_bytes[j]), "all_gather_buffers")
            add.add(wins[j][0], wins[j][1] if raf else order[L - 1 - j], unsh(layer_bytes[j]), "unsharded_parameters")
        if raf:  # backward gathers them again: the root once, each layer prefetched while the one after it runs
            add.add(root0, bw1, unsh(root_bytes), "unsharded_parameters")
            add.add(root0, root0 + 1, unsh(root_bytes), "all_gather_buffers")
            starts = [root0] + order[:-1]
            for k in range(L):
                j = L - 1 - k
                add.add(starts[k], order[k], unsh(layer_bytes[j]), "unsharded_parameters")
                add.add(starts[k - 1] if k else root0, starts[k] + 1, unsh(layer_bytes[j]), "all_gather_buffers")
        # gradients: each layer's are reduced (and freed) when backward leaves the layer; the rank
        # keeps its shard of them, in one block, until they are released
        g, grp = s.grads, s.grad_group
        if ratio != 1.0:
            ch.size[g] = round_block(np.round(f.size[g] * ratio).astype(np.int64))
        for k in range(L):
            mine = g[grp == k]
            add.add(order[k], int(f.free[mine].max()), int(layer_shard[L - 1 - k]), "sharded_gradients")
            add.add(order[k], order[k + 1] if k + 1 < L else bw1, int(round_block(layer_bytes[L - 1 - k])),
                    "reduce_scatter_buffers")
            ch.free[mine] = np.minimum(ch.free[mine], order[k])
        root = g[grp < 0]
        if len(root):
            ch.free[root] = np.minimum(ch.free[root], bw1)
            add.add(bw1, int(f.free[root].max()), root_shard, "sharded_gradients")
    notes.insert(0, f"FSDP2 over {L} layers and the root ({format_bytes(root_bytes)} of the root's own parameters): "
                 f"each rank keeps 1/{ranks} of the parameters, gradients and optimizer state; a layer's parameters are "
                 "gathered whole while it runs forward and backward"
                 + (" (kept from forward to backward: reshard_after_forward=False)" if not raf else ""))
    if pd is not None:
        notes.append(f"parameters gathered in {pd}: {ratio:g} x their size in the trace")
    if evenly:
        notes.append("the layers' forward could not be told apart by their saved activations: each layer's forward is "
                     "taken as an even share of the forward")
    return notes


BUILDERS = {"ddp": _ddp, "zero1": lambda *a: _zero(*a, stage=1), "zero2": lambda *a: _zero(*a, stage=2),
            "fsdp2": _fsdp2}


@dataclass
class PlanChange:
    """A plan as a change of the trace's blocks (``Change``: sizes, frees, added blocks, all constant
    in the batch) with the role of each added block and the notes that say what was assumed."""

    facts: Facts
    change: Change
    roles: np.ndarray
    notes: list[str]
    params: Params
    low: np.ndarray | None  # blocks halved too in the lower reading (None: one reading)


def plan_change(an: Analysis, patterns: list[Pattern], name: str, ranks: int = 1, rank: int = 0,
                param_dtype: str | None = None, reshard_after_forward: bool = True, bucket_view: bool = False,
                rebuild_buckets: bool = True) -> PlanChange | str:
    """The plan as blocks changed, or why it does not apply (what the trace lacks)."""
    if name not in PLANS:
        raise PhasememError(f"unknown plan {name!r}: give one of {', '.join(PLANS)}")
    if int(ranks) < 1 or not 0 <= int(rank) < int(ranks):
        raise PhasememError(f"plan {name}: rank {rank} of {ranks} ranks does not exist")
    if param_dtype is not None:
        dtype_bytes(param_dtype)
        if name != "fsdp2":
            return f"param_dtype is FSDP2's MixedPrecisionPolicy; {name} keeps the trace's dtype"
    if not len(an.trace):
        return "the trace has no events"
    f = Facts(an, patterns)
    world = int((an.trace.meta or {}).get("world_size") or 1) if isinstance(an.trace.meta, dict) else 1
    if world > 1:
        return _from_rank(an, f, name, int(ranks), world, param_dtype, reshard_after_forward)
    steps = step_blocks(f)
    params = params_of(an, f, steps)
    if isinstance(params, str):
        return params
    st = {"param_dtype": param_dtype, "reshard_after_forward": reshard_after_forward, "bucket_view": bucket_view,
          "rebuild_buckets": rebuild_buckets}
    ch, add = f.change(""), Added()
    notes = BUILDERS[name](f, steps, params, int(ranks), int(rank), st, ch, add)
    if isinstance(notes, str):
        return notes
    a_alloc, a_free, a_size, a_role = add.arrays()
    ch.added = (a_alloc, a_free, a_size)
    ch.added_kind = np.full(len(a_size), CONSTANT, np.int8)
    ch.explanation = notes[0]
    ch.assumptions = notes[1:]
    return PlanChange(f, ch, a_role, notes + [f"the parameters from {params.source}"], params, st.get("_low"))


def _from_rank(an: Analysis, f: Facts, name: str, ranks: int, world: int, param_dtype, reshard_after_forward):
    """From one rank's trace of an FSDP2 job of ``world`` ranks, the same job at ``ranks``: each
    shard (parameters, optimizer state, a layer's reduced gradients) takes its size at the new world
    size; the gathered layers, the buffers and the activations stay as the trace has them."""
    from .parallel import R, roles
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


def plan(an: Analysis, patterns: list[Pattern], name: str, ranks: int = 1, rank: int = 0,
         param_dtype: str | None = None, reshard_after_forward: bool = True, bucket_view: bool = False,
         rebuild_buckets: bool = True) -> Plan:
    """What rank ``rank`` of ``ranks`` would hold under plan ``name`` (one of PLANS), replayed on the trace.

    Example:
        >>> plan(report.analysis, report.patterns, "zero1", ranks=4).predicted_peak_bytes
    """
    from .replay import Replayed, changed_points
    from .whatif import _base
    settings = {"param_dtype": param_dtype, "reshard_after_forward": reshard_after_forward, "bucket_view": bucket_view,
                "rebuild_buckets": rebuild_buckets}
    out = Plan(name, int(ranks), int(rank), False,
               settings={k: v for k, v in settings.items() if k in _SETTINGS.get(name, ()) and v is not None})
    pc = plan_change(an, patterns, name, ranks, rank, **settings)
    if isinstance(pc, str):
        out.why = [pc]
        return out
    f, ch = pc.facts, pc.change
    z = np.zeros(0, np.int64)
    a_alloc, a_free, a_size = ch.added or (z, z, z)
    life = an.timeline.lifetimes
    base = _base(an)
    pts = changed_points(base, life.alloc_event, life.free_event, life.size, ch.free, ch.size, ch.added or ())
    r = Replayed.of_points(pts, an.facts.run_first, [], "", [])
    if pc.low is not None and len(pc.low):
        size = ch.size.copy()
        size[pc.low] = np.round(size[pc.low] * HALF_COMPUTE).astype(np.int64)
        out.predicted_peak_bytes_low = int(changed_points(base, life.alloc_event, life.free_event, life.size,
                                                          ch.free, size, ch.added).max())
    e = r.peak_event
    phases = np.zeros(len(PHASES), np.int64)
    np.maximum.at(phases, an.facts.run_phase, r.run_peaks)
    ran = np.bincount(an.facts.run_phase, minlength=len(PHASES)) > 0
    alive = (f.alloc <= e) & (ch.free > e) & (ch.size > 0)
    cats = np.bincount(f.cat[alive], weights=ch.size[alive], minlength=len(CATEGORIES)).astype(np.int64)
    on = (a_alloc <= e) & (a_free > e)
    roles = np.bincount(pc.roles[on], weights=a_size[on], minlength=len(ROLES)).astype(np.int64)
    for k, role in enumerate(ROLES):
        cats[C[ROLE_CATEGORY[role]]] += roles[k]
    out.applies = True
    out.predicted_peak_bytes = r.peak_bytes
    out.peak_phase = PHASES[int(an.labels[e])]
    out.peak_step = int(an.step_of[e]) if an.step_of[e] >= 0 else None
    out.phase_peaks = {PHASES[k]: int(phases[k]) for k in np.flatnonzero(ran)}
    out.categories = {CATEGORIES[k]: int(cats[k]) for k in range(len(CATEGORIES))}
    out.wrapper = {ROLES[k]: int(roles[k]) for k in range(len(ROLES)) if roles[k]}
    out.why = pc.notes
    out.confidence = ("medium" if pc.params.source.startswith("the parameter table") and out.predicted_peak_bytes_low is None
                      else "low")
    out.explanation = pc.notes[0]
    return out


_SETTINGS = {"ddp": ("bucket_view", "rebuild_buckets"), "zero1": ("bucket_view", "rebuild_buckets"), "zero2": (),
             "fsdp2": ("param_dtype", "reshard_after_forward")}


#: The rank counts the plan picture shows for each plan.
GRID_RANKS = (1, 2, 4, 8, 16)


@dataclass
class PlanBar:
    """One bar of the plan picture: a plan at a rank count, its peak per rank by category, and the
    largest batch factor per rank that fits the budget (None: not solved, or the plan does not apply)."""

    plan: Plan
    largest_factor: float | None = None
    fits_why: str = ""

    def to_dict(self) -> dict:
        return {"plan": self.plan.to_dict(), "largest_factor": self.largest_factor, "fits_why": self.fits_why}


def plan_grid(report, budget: int | None = None, plans: tuple = PLANS, ranks: tuple = GRID_RANKS,
              **settings) -> list[PlanBar]:
    """Every plan at every rank count, with the largest batch factor per rank under ``budget``: what
    ``phasemem plan`` draws. ``settings`` go to the plans that take them.

    Example:
        >>> bars = plan_grid(report, 80 << 30, param_dtype="bf16")
        >>> [(b.plan.plan, b.plan.ranks, b.plan.predicted_peak_bytes, b.largest_factor) for b in bars]
    """
    out = []
    for name in plans:
        kw = {k: v for k, v in settings.items() if k in _SETTINGS[name]}
        for n in ranks:
            p = report.plan(name, n, **kw)
            bar = PlanBar(p)
            if budget is not None and p.applies:
                try:
                    fx = report.fits(budget, plan=name, ranks=n, **kw)
                    bar.largest_factor = fx.batch.largest_factor if fx.batch.applies else None
                    bar.fits_why = "" if fx.batch.applies else fx.batch.why[0]
                except PhasememError as e:
                    bar.fits_why = str(e)
            out.append(bar)
    return out
