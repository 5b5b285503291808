"""Gradients: allocated layer by layer during backward (the stripes), kept past backward for the
optimizer, released by zero_grad(set_to_none=True). Also gradient accumulation, which is several
forward/backward pairs feeding one optimizer step."""
from __future__ import annotations

import numpy as np

from ...model import Pattern
from ...units import format_bytes
from ...vocab import P
from ..facts import Context, per_trace, update_gradients
from ..spans import concat_ranges
from .shape_kind import INK, ShapeKind


def detect(ctx: Context, step: int) -> list[Pattern]:
    """The step's gradients (the stripes), their release by zero_grad, and its accumulation."""
    grads = update_gradients(ctx, step)
    return _stripes(ctx, step, grads) + _releases(ctx, step) + _accumulation(ctx, step, grads)


def stripes_by_step(ctx: Context) -> np.ndarray:
    """Per step, of its update gradients (Context.update_gradients_by_step): bytes in all, the last one's
    bytes, and whether the last is alone the largest; one row a step, every step at once."""
    idx, bounds = ctx.update_gradients_by_step
    out = np.zeros((len(bounds) - 1, 3), np.int64)
    some = np.flatnonzero(np.diff(bounds) > 0)
    if not len(some):
        return out
    starts, ends = bounds[some], bounds[some + 1]
    size = ctx.size[idx].astype(np.int64)
    total = np.asarray(ctx.update_gradient_bytes, np.int64)[some]  # the bytes the optimizer's detector reads too
    largest = np.maximum.reduceat(size, starts)
    tail = size[ends - 1]
    ties = np.add.reduceat(size == np.repeat(tail, ends - starts), starts)
    out[some] = np.stack([total, tail, (tail == largest) & (ties == 1)], 1)
    return out


def _stripes(ctx: Context, step: int, grads) -> list[Pattern]:
    out = []
    if len(grads):
        rows = _stripe_rows(ctx)
        b0, b1 = rows["bounds"][step], rows["bounds"][step + 1]
        first, last = rows["alloc"][b0], rows["alloc"][b1 - 1]
        total, tail, alone = rows["stripes"][step]
        # The embedding's gradient comes last and is the one largest (vocabulary × width); a last gradient
        # that is not alone at the top is some other first layer (cranberrii_ftcourse: a LoRA adapter's,
        # 128 KiB like a dozen others, the embedding frozen), so nothing is said of it.
        embedding = " — in a language model that is the embedding's, the first layer of forward" if alone else ""
        text = (f"Gradients: {len(grads)} buffers, {format_bytes(total)} in all, allocated as backward reaches "
                f"each layer (the stripes); the last ({format_bytes(tail)}) comes at the very end{embedding}. They "
                f"stay until zero_grad or the next step. A dense gradient has its parameter's size, so their total is "
                f"about that of the trainable parameters (a sparse one, as Embedding(sparse=True) makes, is "
                f"smaller).")
        details = {"count": int(len(grads)), "last_bytes": tail}
        peak_event, held = last, total
        if ctx.optimizer_in_backward(step):
            # each is freed by its own update inside backward: what is held is the most alive at once
            held, peak_event = _most_alive(ctx, grads)
            text = (f"Gradients: {len(grads)} buffers, {format_bytes(total)} in all, made as backward reaches each "
                    f"layer; the optimizer runs inside backward (a step per parameter, from gradient hooks), so each "
                    f"is freed right after its update: at most {format_bytes(held)} of them exist at once, not their "
                    f"total.")
            details["in_backward"] = True
        out.append(Pattern(
            # peak_event: where the last gradient arrives and all of them are alive (the highest
            # point of the range is usually the logits' spike at backward's start, not theirs)
            kind="gradients", step=step, phase="backward", start_event=first, end_event=last,
            peak_event=peak_event, bytes=held, explanation=text, details=details,
            members=tuple(rows["idx"][b0:b1]),
        ))
    return out


@per_trace
def _stripe_rows(ctx: Context) -> dict:
    """stripes_by_step and the update gradients with their alloc events, as lists: a step's numbers
    are then a slice, not arrays indexed a step at a time."""
    idx, bounds = ctx.update_gradients_by_step
    return {"idx": idx.tolist(), "alloc": ctx.alloc[idx].tolist(), "bounds": bounds.tolist(),
            "stripes": stripes_by_step(ctx).tolist()}


def _most_alive(ctx: Context, grads) -> tuple[int, int]:
    """The most bytes of these allocations alive together, and the event where that is reached."""
    at = np.concatenate([ctx.alloc[grads], ctx.free[grads]])
    delta = np.concatenate([ctx.size[grads], -ctx.size[grads]])
    order = np.lexsort((delta, at))  # at one event a free comes before an alloc
    alive = np.cumsum(delta[order])
    k = int(np.argmax(alive))
    return int(alive[k]), int(at[order][k])


def _releases(ctx: Context, step: int) -> list[Pattern]:
    out = []
    for z0, z1, nbytes, count, advice in _release_rows(ctx).get(step, ()):
        out.append(Pattern(
            kind="gradients", step=step, phase="zero_grad", start_event=z0, end_event=z1,
            peak_event=z0, bytes=nbytes,
            explanation=(
                # the same frees whether zero_grad(set_to_none=True) or the loop's own .grad = None made them
                # (h14_sgd_by_hand has no optimizer object to call zero_grad on)
                f"The gradients are released (zero_grad(set_to_none=True), or each .grad set to none by hand): "
                f"{format_bytes(nbytes)} freed at once.{advice}"
            ),
            details={"release": True, "count": count},
        ))
    return out


@per_trace
def _release_rows(ctx: Context) -> dict[int, list[tuple]]:
    """Per step, the zero_grad runs that release gradients: (first event, last, bytes freed, how many,
    the advice), every step's at once (each step's backward and forward bounds: Context.phase_span)."""
    n_steps, none = len(ctx.seg.steps), ctx.n + 1
    in_steps = (ctx.run_step >= 0) & (ctx.run_step < n_steps)
    bwd_first, bwd_last = (c.tolist() for c in ctx.phase_span("backward"))
    fwd_first = ctx.phase_span("forward")[0].tolist()  # none: no forward run
    frees = _frees_by_run(ctx)
    z = np.flatnonzero(in_steps & (ctx.run_phase == P["zero_grad"]))  # each step's in event order
    out: dict[int, list[tuple]] = {}
    for step, z0, z1 in zip(ctx.run_step[z].tolist(), ctx.run_first[z].tolist(), ctx.run_last[z].tolist()):
        if ctx.optimizer_in_backward(step) and bwd_first[step] < z0 < bwd_last[step]:
            continue  # a per-parameter zero_grad of an update inside backward: the stripes say so
        nbytes, count = frees.get(z0, (0, 0))
        if not count:
            continue
        # the advice only where it applies: a zero_grad after this step's forward began
        if fwd_first[step] < z0:
            advice = (" Releasing them right after the update (rather than just before backward) keeps them from "
                      "sitting alongside the next forward's activations.")
        elif fwd_first[step] < none:
            advice = " It runs before this step's forward, so they do not sit alongside its activations."
        else:  # a step the trace opens inside (h8_mid_step_start): its forward may have run unrecorded
            advice = ""
        out.setdefault(step, []).append((z0, z1, nbytes, count, advice))
    return out


def _frees_by_run(ctx: Context) -> dict[int, tuple[int, int]]:
    """Per zero_grad run (by its first event): the bytes its frees release and how many, every run at
    once. Counted by the curve, so gradients made before recording began (a warm-up step) count too."""
    runs = np.flatnonzero(ctx.run_phase == P["zero_grad"])
    if not len(runs):
        return {}
    z0, z1 = ctx.run_first[runs], ctx.run_last[runs]
    _, ev = concat_ranges(z0, z1 + 1)
    d = ctx.timeline.active_after[ev] - ctx.before[ev]  # their changes (no whole-trace delta)
    starts = np.concatenate([[0], np.cumsum(z1 - z0 + 1)[:-1]])
    freed = np.add.reduceat(np.where(d < 0, -d, 0), starts)
    count = np.add.reduceat(d < 0, starts)
    return {f: (b, c) for f, b, c in zip(z0.tolist(), freed.tolist(), count.tolist())}


#: The first micro-batch's backward makes the gradients the later ones add into: at least this share
#: of the step's gradient bytes. A backward that only differentiates inputs (WGAN-GP's gradient
#: penalty, ``autograd.grad(..., create_graph=True)``, h5_wgan_gp in fixtures/heldout5) makes none.
ACCUM_FIRST_SHARE = 0.5


def _passes(fwd, bwd) -> list[list[tuple[int, int]]]:
    """The backward runs grouped into passes: a new pass starts only where a forward ran since the last
    backward run. Two backward calls on one forward (``loss1.backward(retain_graph=True)`` then
    ``loss2.backward()``, h5_two_losses) or one backward cut by a few 'other' events are one pass."""
    out: list[list[tuple[int, int]]] = []
    for b in bwd:
        prev = out[-1][-1][1] if out else -1
        if any(prev < f0 < b[0] for f0, _ in fwd):
            out.append([b])
        elif out:
            out[-1].append(b)
        # a backward with no forward before it in the step (a trace cut inside one) is no pass
    return out


def _accumulation(ctx: Context, step: int, grads) -> list[Pattern]:
    out: list[Pattern] = []
    bwd = ctx.runs_of(step, "backward")
    if len(bwd) < 2:
        return out  # each pass holds a backward run: fewer than two passes (most steps)
    # Accumulation keeps the gradients across the passes: a zero_grad between two of them resets them
    # (LBFGS re-evaluating its closure inside one step: truth_lbfgs), so that is no accumulation.
    reset = bool(bwd) and any(bwd[0][1] < z0 < bwd[-1][0] for z0, _ in ctx.runs_of(step, "zero_grad"))
    passes = _passes(ctx.runs_of(step, "forward"), bwd)
    if len(grads) and len(passes) >= 2:
        # Passes before the one that makes the gradients fed none; that one must make most of them.
        first = int(ctx.alloc[grads].min())
        passes = [ps for ps in passes if ps[-1][1] >= first]
        made = ctx.alloc[grads] <= passes[0][-1][1]
        if int(ctx.size[grads][made].sum()) < ACCUM_FIRST_SHARE * int(ctx.size[grads].sum()):
            passes = []
    if len(passes) >= 2 and not reset:
        s0, s1, _ = ctx.seg.steps[step]
        n_micro = len(passes)
        out.append(Pattern(
            kind="gradient_accumulation", step=step, phase="backward", start_event=s0, end_event=s1 - 1,
            peak_event=ctx.peak_in(s0, s1 - 1), bytes=int(ctx.size[grads].sum()) if len(grads) else 0,
            explanation=(
                f"Gradient accumulation: {n_micro} forward/backward passes feed one optimizer step. Each "
                f"micro-batch's activations are freed by its backward, while the gradients stay allocated across "
                f"all of them; peak memory is set by one micro-batch, not by the whole batch."
            ),
            details={"microbatches": n_micro},
            members=tuple(grads.tolist()),
        ))
    return out


#: What a gradients shape's figure measures where it is not all of them: zero_grad's release (what it
#: frees at once), and gradients each freed by its own update inside backward (the most alive at once).
GRADIENTS_RELEASED = "freed at once"
GRADIENTS_IN_BACKWARD = "most at once"


def _gradients_are(details: dict) -> str:
    if details.get("release"):
        return GRADIENTS_RELEASED
    if details.get("in_backward"):
        return GRADIENTS_IN_BACKWARD
    return "all of them"


KINDS = (
    ShapeKind("gradients", detect, per_step=True, marker="P", colour=INK, priority=80, size_label=_gradients_are,
              explanation="The gradients: made layer by layer in backward (the stripes), kept for the update, "
                          "released by zero_grad.", order=60),
    ShapeKind("gradient_accumulation", detect, per_step=True, marker="X", colour=INK, priority=90,
              size_label="all of them",
              explanation="Several forward/backward passes feeding one optimizer step, the gradients kept "
                          "across them.", order=70),
)
