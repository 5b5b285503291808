"""The optimizer's state, created in its first step and kept, and the temporaries of each update."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from ...model import Pattern
from ...units import format_bytes
from ...vocab import P
from ..facts import Context, per_trace
from ..infer.frames import inside_file
from ..spans import concat_ranges
from .shape_kind import INK, ShapeKind

_CLASS = re.compile(r"^Optimizer\.step#(\w+)\.step")
_FUSABLE = {"Adam", "AdamW", "SGD", "Adagrad"}
#: Updates that end in a division (by sqrt of a second moment): their last temporary is its operand.
#: SGD's is not (h6_legacy_empty_cache: Nesterov momentum with weight decay).
_DIVIDING = {"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "RMSprop", "Adadelta", "SparseAdam"}


@per_trace
def optimizer_class(ctx: Context) -> str | None:
    """The optimizer's class, from PyTorch's own ``Optimizer.step#<Class>.step`` annotation."""
    for name in ctx.trace.markers.name:
        m = _CLASS.match(name)
        if m:
            return m.group(1)
    return None


#: State that replaces freed blocks of its own sizes (an optimizer that rebinds ``state["m"] = ...``
#: every step, as the hand-written AdamW of wedsonlin_medium512_train and bcrafton_cs336 in
#: ../shared/wild do) is a steady step, not state created: when at least this share of the kept
#: bytes matches, size for size, blocks the same optimizer run freed that were made before it.
REPLACED = 0.5


@per_trace
def state_sizes(ctx: Context) -> np.ndarray:
    """Sizes optimizer state can have: the parameters' (blocks alive from before recording to the
    end) and the gradients' (Adam keeps two of each, momentum SGD one)."""
    idx = ctx.gradients_by_step[0]  # every step's gradients
    return np.union1d(ctx.param_sizes, ctx.size[idx] if len(idx) else np.zeros(0, np.int64))


def replaced_share(ctx: Context, kept: np.ndarray, o0: int, o1: int) -> float:
    """The share of ``kept``'s bytes that replaces, size for size, blocks made before the run at
    o0..o1 and freed inside it."""
    life = ctx.timeline.lifetimes
    old = life.size[(life.free_event >= o0) & (life.free_event <= o1) & (life.alloc_event < o0)]
    if not len(old) or not len(kept):
        return 0.0
    sizes, want = np.unique(ctx.size[kept], return_counts=True)
    have = np.array([int((old == v).sum()) for v in sizes.tolist()])
    return float((np.minimum(want, have) * sizes).sum()) / float(ctx.size[kept].sum())


@per_trace
def own_code(ctx: Context) -> str | None:
    """The file of a hand-written optimizer: the user's code that the optimizer's allocations run in
    (torch names any subclass's step ``Optimizer.step#<Class>.step``, so the annotation cannot tell
    torch.optim.AdamW from a course's own AdamW). None for torch's own, or without frames."""
    trace = ctx.trace
    ids = np.unique(trace.stack[ctx.alloc[ctx.phase_at_alloc == P["optimizer"]]])
    files = []
    for sid in ids[ids >= 0].tolist():
        py = [trace.frames[f][0] for f in trace.stacks[sid] if trace.frames[f][0].endswith(".py")]
        if any("torch/optim/" in fn and not fn.endswith("optimizer.py") for fn in py):
            return None
        files += [fn for fn in py if not ("/torch/" in fn or "site-packages/" in fn or "dist-packages/" in fn)]
    return files[0] if files else None


@per_trace  # asked once per step by the state detector: 13k steps of a 6M-event trace rescanned every run
def first_optimizer_step(ctx: Context) -> int:
    """The first step whose optimizer made an event (-1 if none did)."""
    steps = ctx.run_step[ctx.run_phase == P["optimizer"]]
    return int(steps.min()) if len(steps) else -1


#: Inferred from lifetimes alone, state must be at least this share of the gradients' bytes (momentum
#: SGD keeps one buffer per parameter, Adam two); a few MiB kept by a misplaced phase are not state
#: (heldout_gpt_compile_ckpt without frames: 1-8 MiB claimed in a later step).
MIN_STATE_SHARE = 0.5


@per_trace
def _state_steps(ctx: Context) -> set[int]:
    """The steps that may create state (_created_state's first tests, for every step at once): those
    that run the optimizer, the first of them or one training new parameters."""
    first = first_optimizer_step(ctx)
    return {s for s, (_, _, ran) in enumerate(ctx.seg.steps) if ran and (s == first or _new_parameters(ctx, s))}


def _created_state(ctx: Context, step: int, grad_bytes: int) -> np.ndarray:
    """The optimizer state this step creates (indices into the alloc arrays), over all its optimizer
    runs: made there and alive to the trace's end (state stays for the rest of training; what a later
    zero_grad frees is a gradient the phases misplaced, gpt_ckpt_fused_seedlike without frames).
    Created once: by the first step that runs the optimizer, seen whole (a trace that starts inside a
    step may have lost the state's making), and not where it replaces state of its sizes."""
    if not ctx.seg.steps[step][2]:
        return np.zeros(0, np.int64)
    later = step != first_optimizer_step(ctx)
    if later and not _new_parameters(ctx, step):
        return np.zeros(0, np.int64)
    parts = []
    for o0, o1 in ctx.runs_of(step, "optimizer"):
        idx = ctx.allocs_between(o0, o1)
        idx = idx[(ctx.phase_at_alloc[idx] == P["optimizer"]) & (ctx.free[idx] >= ctx.n)]
        if len(idx) and replaced_share(ctx, idx, o0, o1) < REPLACED:
            parts.append(idx)
    kept = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    # Inferred from lifetimes alone, the optimizer's end is a guess: only blocks of the parameters'
    # sizes, as much as MIN_STATE_SHARE of the gradients, are taken for state. Marked, annotated or
    # framed, all of it is (Adafactor's factored state, RMSprop's three buffers per parameter:
    # heldout_t5_adafactor, heldout_lstm_rmsprop).
    if len(kept) and ctx.seg.sources.get("optimizer") == "inferred" and ctx.seg.inferred_by == "lifetimes":
        sizes = state_sizes(ctx)
        kept = kept[np.isin(ctx.size[kept], sizes)] if len(sizes) else kept
        if int(ctx.size[kept].sum()) < MIN_STATE_SHARE * grad_bytes or not grad_bytes:
            kept = kept[:0]
    if later and (not grad_bytes or int(ctx.size[kept].sum()) < MIN_STATE_SHARE * grad_bytes):
        kept = kept[:0]  # a later step's state is its own parameters', as much as half their gradients
    return kept


def _new_parameters(ctx: Context, step: int) -> bool:
    """Whether this step trains parameters no earlier optimizer step did: its gradients' sizes are a
    set no earlier step had (optimizers taking turns: SAC's actor after its critics, h7_sac;
    WGAN-GP's generator after its critic, h5_wgan_gp). Only where phases are placed by markers,
    annotations or frames: from lifetimes alone a later step's kept blocks are too often misplaced."""
    if ctx.seg.inferred_by == "lifetimes" and ctx.seg.sources.get("optimizer") == "inferred":
        return False
    return step in _steps_with_new_parameters(ctx)


@per_trace
def _steps_with_new_parameters(ctx: Context) -> set[int]:
    """The steps, from the first optimizer step on, that are the first with their set of gradient sizes."""
    first_with: dict = {}
    idx, bounds = ctx.gradients_by_step
    # every step's sizes sorted at once: by step (their order in idx), then size
    step = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    sizes = ctx.size[idx][np.lexsort((ctx.size[idx], step))].tolist()
    for s in range(max(first_optimizer_step(ctx), 0), len(ctx.seg.steps)):
        sig = tuple(sizes[bounds[s]:bounds[s + 1]])
        if sig:
            first_with.setdefault(sig, s)
    return set(first_with.values())


#: What a named optimizer's state is, with the buffers per parameter that make it so.
_STATE_OF = {"Adam": (2, "exp_avg and exp_avg_sq: two numbers per parameter"),
             "AdamW": (2, "exp_avg and exp_avg_sq: two numbers per parameter"),
             "SGD": (1, "one momentum buffer per parameter")}
#: A ratio of state to gradients within this of a whole number is that many buffers per parameter.
WHOLE_RATIO = 0.02


#: State below this share of the gradients is less than one buffer of the gradients' size per
#: parameter: kept in fewer bits or factored (h16_adam8bit: int8 and uint8 moments with an fp32 scale
#: per 2,048 values, 0.50x its fp32 gradients, was "sized otherwise (preconditioners ...)" and told to
#: use "an 8-bit or factored optimizer").
SMALLER = 1 - WHOLE_RATIO


def _state_words(cls, ratio) -> str:
    """What the state is, said only as far as its size shows it: a named optimizer's buffers where the
    ratio to the gradients is theirs; a whole number of buffers; state smaller than the gradients;
    SparseAdam's dense state beside sparse gradients; or state not sized per parameter
    (h10_shampoo_subclass: 4.36x, preconditioners sized by the weights' shapes, had "buffers per
    parameter (Adam keeps two, momentum SGD one)"; Adam(amsgrad=True) keeps three)."""
    if not ratio:
        return "buffers per parameter (Adam keeps two, momentum SGD one)"
    k = int(round(ratio))
    if k >= 1 and abs(ratio - k) <= WHOLE_RATIO:
        if cls in _STATE_OF and _STATE_OF[cls][0] == k:
            return _STATE_OF[cls][1]
        return {1: "one buffer the size of each parameter", 2: "two buffers the size of each parameter"}.get(
            k, f"{k} buffers the size of each parameter")
    if cls == "SparseAdam":
        # h6_sparse_two_opt (27.2x), h16_graphsage_sampled (5.73x): the moments cover every row, the
        # gradient only the rows the batch looked up
        return ("SparseAdam keeps its two moments dense, for every row of the embedding, while a sparse gradient "
                "holds only the rows the batch looked up: the state is no whole number of gradients")
    if ratio < SMALLER:
        return ("less than one buffer of the gradients' size per parameter: state kept in fewer bits (8-bit "
                "moments with a scale per block, as 8-bit Adam keeps; 16-bit moments), factored moments "
                "(Adafactor), a history that grows step by step (LBFGS), or state for some parameters only")
    return ("not a whole number of buffers per parameter: the state is sized otherwise (preconditioners and "
            "factored moments follow the weights' shapes, LBFGS keeps a history of updates, some optimizers keep "
            "state for some parameters only)")


def _state_pattern(ctx: Context, step: int, kept: np.ndarray, grad_bytes: int, cls) -> Pattern:
    nbytes = int(ctx.size[kept].sum())
    ratio = nbytes / grad_bytes if grad_bytes else None
    times = f", {ratio:.2f}× the gradients" if ratio else ""
    what = _state_words(cls, ratio)
    first, last = int(ctx.alloc[kept].min()), int(ctx.alloc[kept].max())
    opening = ("The optimizer creates its state on its first step: " if step == first_optimizer_step(ctx) else
               "This step's optimizer creates state for parameters no earlier step trained (a second optimizer's "
               "first step, optimizers taking turns): ")
    return Pattern(
        kind="optimizer_state_init", step=step, phase="optimizer", start_event=first, end_event=last,
        peak_event=ctx.peak_in(first, last), bytes=nbytes,
        explanation=(
            f"{opening}{format_bytes(nbytes)}{times} — "
            f"{what}. It stays for the rest of training, raising every later step's floor. "
            + ("Sharding the state (FSDP/ZeRO) makes it smaller still." if ratio and ratio < SMALLER else
               "An 8-bit or factored optimizer, or sharding the state (FSDP/ZeRO), makes it smaller.")
        ),
        details={"count": int(len(kept)), "ratio_to_gradients": round(ratio, 4) if ratio else None,
                 "optimizer": cls},
        members=tuple(kept.tolist()),
    )


#: Where the stack runs through these, torch.compile is compiling, not the update running: building the
#: guards of a compiled ``opt.step`` prints every parameter (``Tensor.__repr__``), 16,655 blocks of at
#: most 1 KiB inside the first optimizer range of h16_compiled_fused, which were "the update's
#: temporaries ... a foreach update makes per-parameter intermediates".
COMPILING_FILES = ("torch/_dynamo/convert_frame.py", "torch/_dynamo/guards.py", "torch/_inductor/compile_fx.py")


def detect(ctx: Context, step: int) -> list[Pattern]:
    """The state the step's optimizer creates, and each of its runs' temporaries."""
    out = []
    cls = optimizer_class(ctx)
    if step in _state_steps(ctx):
        grad_bytes = ctx.update_gradient_bytes[step]
        state = _created_state(ctx, step, grad_bytes)
        if len(state):
            out.append(_state_pattern(ctx, step, state, grad_bytes, cls))
    for temp, numbers in _temporaries_by_step(ctx).get(step, ()):
        out.append(_temporaries(ctx, step, temp, cls, *numbers))
    if ctx.optimizer_in_backward(step):
        out = _one_update_per_step(out)
    return out


@per_trace
def _temporaries_by_step(ctx: Context) -> dict[int, list]:
    """temporaries_by_run, what torch.compile allocates while compiling left out."""
    return temporaries_by_run(ctx, inside_file(ctx.trace, COMPILING_FILES))


def temporaries_by_run(ctx: Context, compiling: np.ndarray) -> dict[int, list]:
    """Per step, each optimizer run's temporaries (made and freed inside it, not by torch.compile
    compiling: ``compiling`` per event), where it has at least two, with (most alive at once, the
    event where that is first reached, the flagpole): every run of the trace at once. Each
    temporary lives inside its run, so one running sum over all of them is each run's curve."""
    n_steps = len(ctx.seg.steps)
    runs = np.flatnonzero((ctx.run_phase == P["optimizer"]) & (ctx.run_step >= 0) & (ctx.run_step < n_steps))
    o0, o1 = ctx.run_first[runs], ctx.run_last[runs]
    lo, hi = ctx.alloc.searchsorted(o0), ctx.alloc.searchsorted(o1 + 1)
    rid, idx = concat_ranges(lo, hi)
    keep = (ctx.phase_at_alloc[idx] == P["optimizer"]) & (ctx.free[idx] <= o1[rid])
    keep[keep] = ~compiling[ctx.alloc[idx[keep]]]
    idx, rid = idx[keep], rid[keep]
    keep = (np.bincount(rid, minlength=len(runs)) >= 2)[rid]
    idx, rid = idx[keep], rid[keep]
    if not len(idx):
        return {}
    a, f, size = ctx.alloc[idx], ctx.free[idx], ctx.size[idx].astype(np.int64)
    at = np.concatenate([a, f])  # an event makes or frees one block: no two are equal
    # so their order is where each lands among the events: a scatter (argsort was a third of this)
    mark, place = np.zeros(ctx.n, bool), np.empty(ctx.n, np.int64)
    mark[at], place[at] = True, np.arange(len(at))
    order = place[np.flatnonzero(mark)]
    live, ev, rs = np.cumsum(np.concatenate([size, -size])[order]), at[order], np.concatenate([rid, rid])[order]
    seg = np.flatnonzero(np.concatenate([[True], rs[1:] != rs[:-1]]))
    peak = np.maximum.reduceat(live, seg)
    top = np.minimum.reduceat(np.where(live == np.repeat(peak, np.diff(np.append(seg, len(rs)))),
                                       np.arange(len(rs)), len(rs)), seg)
    p = np.where(peak > 0, ev[top], o0[rs[seg]])  # (a run of empty blocks peaks at its start, as argmax did)
    starts = np.flatnonzero(np.concatenate([[True], rid[1:] != rid[:-1]]))
    p_of = np.repeat(p, np.diff(np.append(starts, len(rid))))
    at_peak = (a <= p_of) & (f > p_of)
    # The flagpole is the last sizeable temporary up there, not a scalar made after it.
    most = np.maximum.reduceat(np.where(at_peak, size, 0), starts)
    pole = np.maximum.reduceat(np.where(at_peak & (size >= 0.1 * np.repeat(most, np.diff(np.append(starts, len(rid))))),
                                        np.arange(len(rid)), -1), starts)
    ends = np.append(starts[1:], len(rid))
    pole = np.where(pole >= 0, pole, ends - 1)
    last = np.maximum.reduceat(f, starts)
    out: dict[int, list] = {}
    for k, (s0, s1, r) in enumerate(zip(starts.tolist(), ends.tolist(), rid[starts].tolist())):
        out.setdefault(int(ctx.run_step[runs[r]]), []).append(
            (idx[s0:s1], (int(peak[k]), int(p[k]), int(idx[pole[k]]), int(a[s0]), int(last[k]))))
    return out


def _temporaries(ctx: Context, step: int, temp: np.ndarray, cls: str | None, peak: int, p: int, pole: int,
                 first: int, last: int) -> Pattern:
    """The 'temple with a flagpole' of one optimizer run: its temporaries ``temp`` (at least two), at
    most ``peak`` bytes of them alive at once, first at event ``p``, the flagpole ``pole`` on top, from
    event ``first`` to ``last`` (temporaries_by_run)."""
    pole_bytes = int(ctx.size[pole])
    mine = own_code(ctx)
    if mine:
        advice = (f" This optimizer is your own code ({mine.rsplit('/', 1)[-1]}); torch.optim's fused "
                  f"implementations (e.g. AdamW(fused=True)) update in place and allocate no temporaries.")
    elif cls in _FUSABLE:
        advice = (" Pass fused=True to the optimizer: the fused kernel updates in place and allocates no "
                  "temporaries.")
    else:
        advice = " A fused implementation, where one exists for this optimizer, avoids them."
    pole_text = "for the division just before" if cls in _DIVIDING else "made just before"
    # torch.optim's updates make per-parameter intermediates; one's own may make anything
    # (h10_shampoo_subclass: eigh's workspaces and inverse roots of its preconditioners)
    # the example is the class's own: SGD makes no sqrt (h11_resnet50_amp_cl: weight decay, Nesterov)
    example = {"SGD": " (e.g. the gradient plus weight decay, Nesterov's look-ahead)"}.get(
        cls or "", " (e.g. sqrt(exp_avg_sq))" if cls in _DIVIDING else "")
    how = ("" if mine else
           f"a foreach update makes per-parameter intermediates for all parameters layer by layer{example}, "
           f"a for-loop update one parameter's at a time; ")
    return Pattern(
        kind="optimizer_temporaries", step=step, phase="optimizer", start_event=first, end_event=last,
        peak_event=p, bytes=peak,
        explanation=(
            f"The update's temporaries, the 'temple with a flagpole': {how}"
            f"here up to {format_bytes(peak)} at once. The "
            f"flagpole on top ({format_bytes(pole_bytes)}) is the last temporary, {pole_text} the update "
            f"is applied.{advice}"
        ),
        details={"count": int(len(temp)), "flagpole_bytes": pole_bytes, "optimizer": cls,
                 "own_code": mine},
        members=tuple(temp.tolist()),
    )


def _one_update_per_step(found: list[Pattern]) -> list[Pattern]:
    """Where the optimizer runs inside backward, a parameter at a time, each update is one run: the
    step's temporaries are those of its largest update, not one shape per parameter."""
    temps = [p for p in found if p.kind == "optimizer_temporaries"]
    if len(temps) < 2:
        return found
    top = max(temps, key=lambda p: p.bytes)
    top = replace(top, explanation=(
        f"The update's temporaries: the optimizer runs inside backward, one parameter at a time ({len(temps)} "
        f"updates with temporaries in this step), so only one update's intermediates exist at once; the largest "
        f"is {format_bytes(top.bytes)}." + top.explanation.split(" is applied.", 1)[-1]),
        details={**top.details, "updates": len(temps)},
        members=tuple(sorted(m for p in temps for m in p.members)))
    return [p for p in found if p.kind != "optimizer_temporaries"] + [top]


KINDS = (
    ShapeKind("optimizer_state_init", detect, per_step=True, marker="*", colour=INK, priority=50,
              size_label="the state",
              explanation="The optimizer's state (Adam's two moments), made on its first step and kept for the "
                          "rest of training.", order=80),
    ShapeKind("optimizer_temporaries", detect, per_step=True, marker="p", colour=INK, priority=40,
              size_label="most at once",
              explanation="The update's temporaries, made and freed inside each optimizer run: the temple with a "
                          "flagpole.", order=90),
)
