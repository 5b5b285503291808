"""What the detectors and the categories share about a trace, computed once: allocations with their
lifetimes and the phase at both ends, each step's phase runs, and which allocations are gradients.
No detector imports another, and categories import no detector: both read these facts."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, wraps
from typing import Callable, TypeVar
from weakref import WeakKeyDictionary

import numpy as np

from ..read.trace import Trace
from ..vocab import PHASES, P
from .infer.frames import loss_seeds, workspace_stacks
from .segmentation import Segmentation
from .sizes import in_sorted
from .spans import backward_resumed, concat_ranges, phase_runs
from .timeline import Timeline

T = TypeVar("T")


def per_trace(compute: Callable[["Context"], T]) -> Callable[["Context"], T]:
    """``compute(ctx)`` made on the first call for a Context and kept as long as that Context lives:
    a detector module's own numbers about a trace, every step's at once, which no other module reads.
    The value must not hold the Context (it would keep it alive).

    Example:
        >>> @per_trace
        ... def _rows(ctx: Context) -> dict: ...   # computed once per trace, however many steps ask
    """
    values: WeakKeyDictionary = WeakKeyDictionary()

    @wraps(compute)
    def once(ctx: "Context") -> T:
        try:
            return values[ctx]
        except KeyError:  # (None is a value too: an optimizer class the trace does not name)
            value = values[ctx] = compute(ctx)
            return value

    return once


@dataclass(frozen=True, eq=False)
class Context:
    """The trace's facts that the detectors and the categories read. What several of them read and
    must compute is a cached property, computed on the first read; what one detector module keeps for
    itself is a function of its own made ``per_trace``. Made by ``build``."""

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
        return cls(trace=trace, timeline=tl, seg=seg, level=tl.level, before=tl.active_before,
                   alloc=a, free=f, size=s, phase_at_alloc=labels[a], phase_at_free=pf,
                   step_at_alloc=seg.step_of[a].astype(np.int64),
                   run_first=rf, run_last=rl, run_phase=rp, run_step=rs,
                   param_sizes=life.size[life.preexisting & (life.free_event >= n)])

    @cached_property
    def runs_by_step_phase(self) -> dict[tuple[int, int], tuple[tuple[int, int], ...]]:
        """(step, phase code) -> the (first, last) events of its runs, in event order: grouped once,
        as every detector asks for every step and a mask per call is steps x runs. Shared: not to be changed."""
        out: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for f, last, p, s in zip(self.run_first.tolist(), self.run_last.tolist(), self.run_phase.tolist(),
                              self.run_step.tolist()):
            out.setdefault((s, p), []).append((f, last))
        return {k: tuple(v) for k, v in out.items()}

    def runs_of(self, step: int, phase: str) -> tuple[tuple[int, int], ...]:
        """The (first, last) events of a step's runs of a phase, in event order."""
        return self.runs_by_step_phase.get((step, P[phase]), ())

    @cached_property
    def phase_spans(self) -> tuple[np.ndarray, np.ndarray]:
        """(first, last), each (phase code, step): the first event of the step's first run of the
        phase and the last event of its last (``n + 1`` and -1 where the step has none)."""
        n_steps = len(self.seg.steps)
        sel = (self.run_step >= 0) & (self.run_step < n_steps)
        first = np.full((len(PHASES), n_steps), self.n + 1, np.int64)
        last = np.full((len(PHASES), n_steps), -1, np.int64)
        at = (self.run_phase[sel].astype(np.int64), self.run_step[sel])
        np.minimum.at(first, at, self.run_first[sel])
        np.maximum.at(last, at, self.run_last[sel])
        return first, last

    def phase_span(self, phase: str) -> tuple[np.ndarray, np.ndarray]:
        """phase_spans of one phase: per step, its first event and its last, every step at once."""
        first, last = self.phase_spans
        return first[P[phase]], last[P[phase]]

    @cached_property
    def steps_updating_in_backward(self) -> set[int]:
        """The steps whose optimizer runs inside their backward (spans.backward_resumed)."""
        return set(backward_resumed(self.seg.labels, self.seg.step_of).tolist())

    def optimizer_in_backward(self, step: int) -> bool:
        return step in self.steps_updating_in_backward

    def allocs_between(self, first: int, last: int) -> np.ndarray:
        """Indices (into the alloc arrays) of allocations made at events first..last."""
        # two scalar searches: a list argument costs an array per call, and detectors ask ~10 times a step
        return np.arange(self.alloc.searchsorted(first), self.alloc.searchsorted(last + 1))

    @cached_property
    def workspace_getter_stacks(self) -> np.ndarray:
        """Per stack id, whether it names a math library's workspace getter (infer.frames.workspace_stacks)."""
        return workspace_stacks(self.trace)

    def made_by_workspace_getter(self, events: np.ndarray) -> np.ndarray:
        """Per event: does its stack name a math library's workspace getter? Such a block is no weight
        and no gradient, whatever its size."""
        return self.workspace_getter_stacks[self.trace.stack[events]]

    @cached_property
    def gradients_by_step(self) -> tuple[np.ndarray, np.ndarray]:
        """Every step's gradients at once (gradient_allocs' rules, one pass over the allocations): the
        allocation indices, by step then event, and each step's bounds in them (step s: bounds[s]..bounds[s+1]).

        Example:
            >>> idx, bounds = ctx.gradients_by_step
            >>> step_2 = idx[bounds[2]:bounds[3]]  # gradient_allocs(ctx, 2)
        """
        return _gradients_by_step(self)

    @cached_property
    def update_gradients_by_step(self) -> tuple[np.ndarray, np.ndarray]:
        """update_gradients of every step at once (gradients_by_step's form)."""
        return _update_gradients(self)

    @cached_property
    def update_gradient_bytes(self) -> list[int]:
        """Per step, the bytes of its update gradients: running sums over update_gradients_by_step."""
        idx, bounds = self.update_gradients_by_step
        c = np.concatenate([[0], np.cumsum(self.size[idx].astype(np.int64))])
        return (c[bounds[1:]] - c[bounds[:-1]]).tolist()

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
    backward (a gradient waits for zero_grad, the optimizer or the next step); with parameters made
    before recording, only those of a parameter's or a zero_grad-freed block's size (why:
    docs/categories.md).
    """
    idx, bounds = ctx.gradients_by_step
    if not 0 <= step < len(bounds) - 1:
        return idx[:0]
    return idx[bounds[step]:bounds[step + 1]]


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
        keep = ~loss_seeds(ctx.trace)[ctx.alloc[idx]]
        # The autograd thread's cuBLAS workspace, made in the first backward and kept, is no gradient
        # even where it has a weight's size (h15_gradcache_contrastive: 32 MiB, the embedding's).
        keep &= ~ctx.made_by_workspace_getter(ctx.alloc[idx])
        idx, step = idx[keep], step[keep]
    order = np.argsort(step, kind="stable")  # runs are in event order: within a step, so are its allocations
    idx, step = idx[order].astype(np.int64), step[order]
    bounds = np.searchsorted(step, np.arange(n_steps + 1))
    if len(ctx.param_sizes) and len(idx):
        sizes = np.union1d(ctx.param_sizes, _released_sizes(ctx))
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
    idx, bounds = ctx.update_gradients_by_step
    if not 0 <= step < len(bounds) - 1:
        return idx[:0]
    return idx[bounds[step]:bounds[step + 1]]


def _update_gradients(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    idx, bounds = ctx.gradients_by_step
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
    made_in_backward = ctx.phase_at_alloc == P["backward"]
    freed_by_zero_grad = ctx.phase_at_free == P["zero_grad"]
    return np.unique(ctx.size[made_in_backward & freed_by_zero_grad])
