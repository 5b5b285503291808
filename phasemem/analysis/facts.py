"""What the detectors and the categories share about a trace, computed once: allocations with their
lifetimes and the phase at both ends, each step's phase runs, and which allocations are gradients.
No detector imports another, and categories import no detector: both read these facts."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .infer.frames import loss_seeds, workspace_stacks
from .segmentation import Segmentation
from .sizes import in_sorted
from .spans import backward_resumed, concat_ranges, phase_runs
from .timeline import Timeline
from ..read.trace import Trace
from ..vocab import P


@dataclass
class Context:
    trace: Trace
    timeline: Timeline
    seg: Segmentation
    level: np.ndarray  # highest active bytes while each event ran
    before: np.ndarray  # active bytes just before each event
    # Allocations made inside the trace, in event order.
    alloc: np.ndarray  # alloc event
    free: np.ndarray  # free event, len(trace) if never freed
    size: np.ndarray
    phase_at_alloc: np.ndarray
    phase_at_free: np.ndarray  # -1 if never freed
    step_at_alloc: np.ndarray
    # Phase runs: first event, last event, phase code, step position.
    run_first: np.ndarray
    run_last: np.ndarray
    run_phase: np.ndarray
    run_step: np.ndarray
    param_sizes: np.ndarray  # sizes of the blocks alive from before recording to the end
    _memo: dict = field(default_factory=dict)

    def memo(self, key, compute):
        """Per-trace cache for what several detectors ask for (each step's gradients)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    @property
    def n(self) -> int:
        return len(self.trace)

    @classmethod
    def build(cls, trace: Trace, tl: Timeline, seg: Segmentation) -> "Context":
        life = tl.lifetimes
        born = life.alloc_event >= 0
        a, f, s = life.alloc_event[born], life.free_event[born], life.size[born]
        n = len(trace)
        labels = seg.labels.astype(np.int64)
        pf = np.full(len(f), -1, np.int64)
        freed = f < n
        pf[freed] = labels[f[freed]]
        rf, rl, rp, rs = phase_runs(seg.labels, seg.step_of)
        params = life.size[life.preexisting & (life.free_event >= n)]
        return cls(trace, tl, seg, tl.level, tl.active_before, a, f, s, labels[a], pf,
                   seg.step_of[a].astype(np.int64), rf, rl, rp, rs, params)

    def runs_of(self, step: int, phase: str) -> tuple[tuple[int, int], ...]:
        """The (first, last) events of a step's runs of a phase, in event order."""
        table = self._memo.get("runs_by_step_phase")  # (no closure made per call: ~20,000 calls at 1M events)
        if table is None:
            table = self.memo("runs_by_step_phase", self._runs_by_step_phase)
        return table.get((step, P[phase]), ())

    def _runs_by_step_phase(self) -> dict:
        # grouped once: every detector asks for every step, and a mask per call is steps x runs
        out: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for f, l, p, s in zip(self.run_first.tolist(), self.run_last.tolist(), self.run_phase.tolist(),
                              self.run_step.tolist()):
            out.setdefault((s, p), []).append((f, l))
        return {k: tuple(v) for k, v in out.items()}  # shared by every caller: not to be changed

    def phase_span(self, phase: str) -> tuple[np.ndarray, np.ndarray]:
        """Per step, the first event of its first run of ``phase`` and the last event of its last
        (``n + 1`` and -1 where the step has none), every step at once."""
        def compute():
            n_steps = len(self.seg.steps)
            sel = (self.run_phase == P[phase]) & (self.run_step >= 0) & (self.run_step < n_steps)
            first, last = np.full(n_steps, self.n + 1, np.int64), np.full(n_steps, -1, np.int64)
            np.minimum.at(first, self.run_step[sel], self.run_first[sel])
            np.maximum.at(last, self.run_step[sel], self.run_last[sel])
            return first, last

        return self.memo(f"phase_span:{phase}", compute)

    def optimizer_in_backward(self, step: int) -> bool:
        """Whether the step's optimizer runs inside its backward (spans.backward_resumed)."""
        return step in self.memo("backward_resumed",
                                 lambda: set(backward_resumed(self.seg.labels, self.seg.step_of).tolist()))

    def allocs_between(self, first: int, last: int) -> np.ndarray:
        """Indices (into the alloc arrays) of allocations made at events first..last."""
        # two scalar searches: a list argument costs an array per call, and detectors ask ~10 times a step
        return np.arange(self.alloc.searchsorted(first), self.alloc.searchsorted(last + 1))

    def made_by_workspace_getter(self, events: np.ndarray) -> np.ndarray:
        """Per event: does its stack name a math library's workspace getter (infer.frames.workspace_stacks)?
        Such a block is no weight and no gradient, whatever its size."""
        return self.memo("workspace_stacks", lambda: workspace_stacks(self.trace))[self.trace.stack[events]]

    def peak_in(self, first: int, last: int) -> int:
        return first + int(self.level[first:last + 1].argmax())  # the method: np.argmax's wrapper costs as much, ~9,000 calls

    def peaks_in(self, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """peak_in of many ranges at once (none empty; they may overlap): one pass over the events the
        ranges cover, each range read on its own, so for short ones (a loss, the start of a backward).
        A step's ranges cover the trace: ten times a loop of peak_in there (measured at 1M events)."""
        length = last - first + 1
        if not len(length):
            return np.zeros(0, np.int64)
        starts = np.cumsum(length) - length
        ev = concat_ranges(first, last + 1)[1]
        lv = self.level[ev]
        top = np.repeat(np.maximum.reduceat(lv, starts), length)
        return np.minimum.reduceat(np.where(lv == top, ev, self.n), starts)  # the first event at the top


#: A step's gradients are not trusted when what its backward made and kept, of no weight's size and
#: freed later in the trace, is more than this many times the bytes of the weight-sized ones (in
#: every training trace of ours the weight-sized ones are most of it; h9_per_sample_dpsgd: ~600x).
STRAY_RATIO = 4


def gradient_allocs(ctx: Context, step: int) -> np.ndarray:
    """Allocations made in a backward run of the step that outlive that run and are not freed in a
    backward (a gradient waits for zero_grad, the optimizer or the next step).

    When the parameters existed before recording, a gradient also has exactly the size of one of
    them, or the size of a block that some backward made and a zero_grad freed (a flat buffer per
    group of parameters: FSDP2's reduce-scatter output, contiguous gradient buffers); that drops the
    autograd thread's own cuBLAS workspace, made lazily in the first backward and kept for good.
    """
    idx, bounds = gradients_by_step(ctx)
    if not 0 <= step < len(bounds) - 1:
        return idx[:0]
    return idx[bounds[step]:bounds[step + 1]]


def gradients_by_step(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """Every step's gradients at once (gradient_allocs' rules, one pass over the allocations): the
    allocation indices, by step then event, and each step's bounds in them (step s: bounds[s]..bounds[s+1]).

    Example:
        >>> idx, bounds = gradients_by_step(ctx)
        >>> step_2 = idx[bounds[2]:bounds[3]]  # gradient_allocs(ctx, 2)
    """
    return ctx.memo("gradients_by_step", lambda: _gradients_by_step(ctx))


def _gradients_by_step(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    n_steps = len(ctx.seg.steps)
    # A gradient lives until zero_grad, the optimizer or the next step: made in one backward run,
    # it is not freed in a later one. Activations of a weight's size are, where backward was cut
    # into runs by other phases (WGAN-GP's penalty, autograd.grad(create_graph=True), inferred
    # without markers: h5_wgan_gp's critic "gradients" were 10.6 MiB of the generator's sizes).
    bwd = np.flatnonzero((ctx.run_phase == P["backward"]) & (ctx.run_step >= 0) & (ctx.run_step < n_steps))
    # only what backward made (a third of the allocations) is looked up in the runs
    idx = np.flatnonzero(ctx.phase_at_alloc == P["backward"])
    r = np.searchsorted(ctx.run_first[bwd], ctx.alloc[idx], "right") - 1  # the backward run at or before each
    rc = np.maximum(r, 0)
    in_run = (r >= 0) & (ctx.alloc[idx] <= ctx.run_last[bwd][rc]) if len(bwd) else np.zeros(len(idx), bool)
    idx, rc = idx[in_run], rc[in_run]
    b1 = ctx.run_last[bwd][rc] if len(bwd) else rc
    f = ctx.free[idx]
    freed_in_bwd = (f < ctx.n) & (ctx.seg.labels[np.minimum(f, ctx.n - 1)] == P["backward"])
    keep = (f > b1) & ~freed_in_bwd
    idx = idx[keep]
    step = ctx.run_step[bwd][rc[keep]] if len(bwd) else rc[keep]
    if len(idx):
        keep = ~ctx.memo("loss_seeds", lambda: loss_seeds(ctx.trace))[ctx.alloc[idx]]
        # The autograd thread's cuBLAS workspace, made in the first backward and kept, is no gradient
        # even where it has a weight's size (h15_gradcache_contrastive: 32 MiB, the embedding's).
        keep &= ~ctx.made_by_workspace_getter(ctx.alloc[idx])
        idx, step = idx[keep], step[keep]
    order = np.argsort(step, kind="stable")  # runs are in event order: within a step, so are its allocations
    idx, step = idx[order].astype(np.int64), step[order]
    bounds = np.searchsorted(step, np.arange(n_steps + 1))
    if len(ctx.param_sizes) and len(idx):
        sizes = ctx.memo("gradient_sizes", lambda: np.union1d(ctx.param_sizes, _released_sizes(ctx)))
        ok = in_sorted(ctx.size[idx], sizes)
        # Far more of what backward made and kept being of no weight's size says the few that are
        # match by chance: per-sample gradients (vmap(grad), batch x each parameter) are no
        # gradients, and the one whose size a pre-existing block happens to have is none either
        # (h9_per_sample_dpsgd: 3 MiB "gradients" of 1.78 GiB per-sample ones).
        stray = ~ok & (ctx.free[idx] < ctx.n)
        size = ctx.size[idx].astype(np.int64)
        # per-step sums as differences of running sums at the steps' bounds (np.add.at: 0.25 s at 10M)
        stray_bytes = np.diff(np.concatenate([[0], np.cumsum(np.where(stray, size, 0))])[bounds])
        ok_bytes = np.diff(np.concatenate([[0], np.cumsum(np.where(ok, size, 0))])[bounds])
        ok &= ~np.repeat(stray_bytes > STRAY_RATIO * ok_bytes, np.diff(bounds))
        idx, step = idx[ok], step[ok]
        bounds = np.searchsorted(step, np.arange(n_steps + 1))
    return idx, bounds


def update_gradients(ctx: Context, step: int) -> np.ndarray:
    """The step's gradients (gradient_allocs) that live to be read by an update: not freed by the
    loop, by no zero_grad or optimizer, before the step's next backward run or its optimizer.
    Gradients of one pass that the loop sums into buffers of its own (``autograd.grad``) and drops
    are gradients, but no update reads them and zero_grad does not release them
    (h16_accum_grad_buffers: 4 x 113 MiB were "gradients, 452 MiB ... they stay until zero_grad"
    and Adam's state "0.50x the gradients")."""
    idx, bounds = update_gradients_by_step(ctx)
    if not 0 <= step < len(bounds) - 1:
        return idx[:0]
    return idx[bounds[step]:bounds[step + 1]]


def update_gradients_by_step(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """update_gradients of every step at once (gradients_by_step's form: the allocation indices by
    step then event, and each step's bounds in them)."""
    return ctx.memo("update_gradients_by_step", lambda: _update_gradients(ctx))


def update_gradient_bytes(ctx: Context) -> list[int]:
    """Per step, the bytes of its update gradients (update_gradients'), every step at once: running sums
    over update_gradients_by_step, not a sum per step."""
    def compute() -> list[int]:
        idx, bounds = update_gradients_by_step(ctx)
        c = np.concatenate([[0], np.cumsum(ctx.size[idx].astype(np.int64))])
        return (c[bounds[1:]] - c[bounds[:-1]]).tolist()

    return ctx.memo("update_gradient_bytes", compute)


def _update_gradients(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    idx, bounds = gradients_by_step(ctx)
    n_steps, width = len(bounds) - 1, ctx.n + 1
    step = np.repeat(np.arange(n_steps, dtype=np.int64), np.diff(bounds))
    # every step's backward and update runs by (step, first event) in one sorted key: the first one
    # begun after a gradient was made, in its own step, is one search for all of them
    sel = (((ctx.run_phase == P["backward"]) | (ctx.run_phase == P["optimizer"]))
           & (ctx.run_step >= 0) & (ctx.run_step < n_steps))
    later = np.sort(ctx.run_step[sel] * width + ctx.run_first[sel])
    a, f = ctx.alloc[idx], ctx.free[idx]
    k = np.searchsorted(later, step * width + a, "right")
    nxt = later[np.minimum(k, len(later) - 1)] if len(later) else np.zeros(len(idx), np.int64)
    # with no backward or update after it in the step, nothing tells (the update may lie in a
    # step the phases cut apart: heldout_bert_mlm without frames lost 30 MiB of its 43 that way)
    has_next = (k < len(later)) & (nxt // width == step)
    at_free = ctx.seg.labels[np.minimum(f, ctx.n - 1)]
    passed = has_next & (f < nxt % width) & (at_free != P["zero_grad"]) & (at_free != P["optimizer"])
    kept = np.concatenate([[0], np.cumsum(~passed)])
    return idx[~passed], kept[bounds]


def _released_sizes(ctx: Context) -> np.ndarray:
    """Sizes of the blocks that a backward made and a zero_grad freed, in any step."""
    def compute():
        made_in_backward = ctx.phase_at_alloc == P["backward"]
        freed_by_zero_grad = ctx.phase_at_free == P["zero_grad"]
        return np.unique(ctx.size[made_in_backward & freed_by_zero_grad])

    return ctx.memo("zero_grad_released_sizes", compute)
