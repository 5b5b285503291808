"""Steps and phases for snapshots recorded without phasemem's markers.

Two sources of evidence, used in this order:

1. **Stack frames** (the default ``_record_memory_history`` records them). Backward runs on the
   autograd engine's thread, whose events carry no Python frames, except Python run there:
   activation-checkpoint recompute (``unpack_hook``/``recompute_fn``) and the loss's first
   gradient (``_make_grads``). The optimizer's events run under ``torch/optim/``, zero_grad under a
   ``zero_grad`` frame, the model's forward under ``nn.Module._call_impl``. Everything else with
   frames (data, logging, the loss outside the model) is 'other', and 'other' between a forward
   and the next backward is the loss.
2. **Lifetimes alone** (snapshots recorded with ``context=None``, or stripped). A step repeats the
   same allocation sizes, so the step period is the distance at which size k-grams recur with
   perfect regularity. Inside each period, forward/backward is a mountain of activations:
   allocations made and freed within the period, alive across its highest point; forward is
   where they are made, backward where they are freed, and what follows is the optimizer.

PyTorch's own ``Optimizer.step#…``/``Optimizer.zero_grad#…`` annotations, when present, already
gave the optimizer and zero_grad phases (and the steps) before this module runs.
"""
from __future__ import annotations

import numpy as np
from scipy.signal import find_peaks

from .timeline import Timeline
from .trace import A, Trace

# Event classes from frames.
NONE, FWD, OPT, ZG, BWD_PY, OTHER = range(6)
FRAMES_USABLE = 0.3  # below this share of events with frames, the frames are not the default context
ZERO_GRAD_MIN = 4  # gradients freed together before it counts as zero_grad
BURST = 8  # frees in a row, with no allocation between, that are not backward's
# An activation lives less than this share of a step (checkpointed block inputs live through the
# long backward, ~0.9; logits a loop keeps until the next step, ~1.1). 0.8/0.9/0.95/1.0 gave a
# mean frameless accuracy of 0.821/0.838/0.840/0.835 on the real snapshots (docs/accuracy.md).
SPAN = 0.95
TAIL, STRAGGLE, GAPS = 3, 0.08, 4  # at most 3 frees, after a quiet stretch 8 % as long as the backward
# and 4 times the usual distance between its frees
MIN_SAVED = 10
GRAD_SHARE = 0.25  # of the parameters' distinct sizes a backward must allocate
TINY, LOOK, PAST, QUICK = 512, 32, 4, 4  # a scalar's block; allocations before the top searched; freed at once
CORE = 0.05  # a pass's core: its activations' allocations and frees less the first and last 5 %  # activations alive at a pass's top before it can be a training pass


def _python(frames):
    # stacks="all" (torch's default) adds C++ frames to every event, the autograd thread's too; the
    # thread is told by its Python frames alone.
    return [f for f in frames if f[0].endswith(".py")]


def frame_classes(trace: Trace) -> np.ndarray:
    """A class per event from its stack (one Python pass over the distinct stacks, not the events)."""
    per_stack = np.empty(len(trace.stacks) + 1, np.int8)
    per_stack[-1] = NONE  # stack id -1
    for sid, frame_ids in enumerate(trace.stacks):
        py = _python([trace.frames[f] for f in frame_ids])
        per_stack[sid] = _classify(py) if py else NONE
    return per_stack[trace.stack]


def _has_python(trace: Trace) -> np.ndarray:
    """Per event: does its stack hold a Python frame."""
    per_stack = np.zeros(len(trace.stacks) + 1, bool)
    for sid, frame_ids in enumerate(trace.stacks):
        per_stack[sid] = any(trace.frames[f][0].endswith(".py") for f in frame_ids)
    return per_stack[trace.stack]


def _classify(frames) -> int:
    # Python run by the autograd engine: checkpoint recompute, a custom or compiled Function's
    # backward, the loss's first gradient.
    if any(nm in ("unpack_hook", "recompute_fn", "_make_grads") for _, _, nm in frames):
        return BWD_PY
    out_fn, _, out_nm = frames[-1]  # the engine calls a Function's backward with nothing above it
    if out_nm == "apply" and out_fn.endswith("torch/autograd/function.py"):
        return BWD_PY
    # Otherwise the innermost telling frame decides: Lightning runs forward inside optimizer.step.
    users = 0  # frames of the user's own code seen so far, innermost first
    for k, (fn, _, nm) in enumerate(frames):
        if nm == "zero_grad":
            return ZG
        if "torch/optim/" in fn:
            # User code inside the optimizer is a closure it called (Lightning's loss). But the frame
            # right inside torch's generic step wrapper (optimizer.py) is a subclass's own step,
            # wherever it lives (bitsandbytes, transformers, timm, the user's file), and a
            # library's code under it is still the optimizer.
            own = k > 0 and fn.endswith("torch/optim/optimizer.py") and _is_user(frames[k - 1][0])
            return OTHER if users - own > 0 else OPT
        if nm == "_call_impl" and fn.endswith("torch/nn/modules/module.py"):
            return FWD
        users += _is_user(fn)
    return OTHER


def _is_user(fn: str) -> bool:
    fn = fn.replace("\\", "/")
    return not ("/torch/" in fn or fn.startswith("torch/") or "site-packages/" in fn or "dist-packages/" in fn)


def has_usable_frames(trace: Trace) -> bool:
    return len(trace) > 0 and float(np.mean(_has_python(trace))) >= FRAMES_USABLE


def labels_from_frames(trace: Trace, tl: Timeline | None = None) -> np.ndarray:
    """Phase codes (segment.P order) per event from frames; ``tl``: the trace's timeline, if already made."""
    from .segment import P

    cls = frame_classes(trace)
    lut = np.array([P["backward"], P["forward"], P["optimizer"], P["zero_grad"], P["backward"], P["other"]], np.int8)
    labels = lut[cls]
    # Recorded with context="alloc", frees carry no frames of their own: a free then takes the
    # phase of the allocations around it when they agree, else 'other'.
    is_alloc = trace.action == A["alloc"]
    if is_alloc.any() and _frees_say_nothing(trace, tl):
        known = np.flatnonzero(is_alloc)
        idx = np.arange(len(labels))
        prev = np.searchsorted(known, idx, "right") - 1
        nxt = prev + 1
        lp = np.where(prev >= 0, labels[known[np.maximum(prev, 0)]], -1)
        ln = np.where(nxt < len(known), labels[known[np.minimum(nxt, len(known) - 1)]], -2)
        # A free's frames are then its allocation's: what was freed, not who freed it. Between two
        # phases it stays with the earlier one if it frees that phase's own allocation (the
        # optimizer's temporaries released after its last alloc).
        own = labels  # the class its (allocation's) frames give
        around = np.where(lp == ln, lp, np.where(own == lp, lp, P["other"]))
        labels = np.where(is_alloc, labels, around).astype(np.int8)
    return labels


def finish(trace: Trace, tl: Timeline | None, labels: np.ndarray) -> np.ndarray:
    """Lifetime rules that hold whatever found the phases: zero_grad's frees, then the loss."""
    from .segment import P

    if tl is not None:
        zero_grad_from_lifetimes(trace, tl, labels)
    _loss_between(labels)
    if tl is not None and not (labels == P["forward"]).any():
        graphed_loss(trace, tl, labels)
    return labels


def zero_grad_from_lifetimes(trace: Trace, tl: Timeline, labels: np.ndarray) -> None:
    """Frees of gradients outside backward are zero_grad(set_to_none=True): a gradient is made in a
    backward run and outlives it. Needs no frames (gradients never have any)."""
    from .segment import P, runs

    life = tl.lifetimes
    n = len(trace)
    born = (life.alloc_event >= 0) & (life.free_event < n)
    a, f = life.alloc_event[born], life.free_event[born]
    first, last, code, _ = runs(labels, np.zeros(n, np.int32))
    run_of = np.searchsorted(first, np.arange(n), "right") - 1
    grad = (labels[a] == P["backward"]) & (run_of[f] != run_of[a]) & (labels[f] != P["backward"])
    fz = np.sort(f[grad])
    # zero_grad frees many gradients together; a lone free after backward (the loss's own
    # gradient, a hook's buffer) is not it.
    cluster = np.concatenate([[0], np.cumsum(np.diff(fz) > 8)]) if len(fz) else np.zeros(0, np.int64)
    sizes = np.bincount(cluster) if len(fz) else np.zeros(0, np.int64)
    fz = fz[sizes[cluster] >= ZERO_GRAD_MIN] if len(fz) else fz
    labels[fz] = P["zero_grad"]
    # the free_requested that announced each of those frees
    req = fz - 1
    ok = (req >= 0) & (trace.action[np.maximum(req, 0)] == A["free_requested"]) & (trace.addr[np.maximum(req, 0)] == trace.addr[fz])
    labels[req[ok]] = P["zero_grad"]


def _frees_say_nothing(trace: Trace, tl: Timeline | None) -> bool:
    """True when free events carry no thread evidence: recorded with context="alloc", a free has no
    frames or repeats its allocation's frames."""
    is_alloc = trace.action == A["alloc"]
    frees = ~is_alloc & np.isin(trace.action, [A["free_requested"], A["free_completed"], A["free"]])
    if not frees.any():
        return False
    if float(np.mean(_has_python(trace)[frees])) < 0.05:
        return True
    life = (tl or Timeline.from_trace(trace)).lifetimes
    pair = (life.alloc_event >= 0) & (life.free_event < len(trace))
    a, f = life.alloc_event[pair], life.free_event[pair]
    framed = trace.stack[a] >= 0
    return bool(framed.any()) and float(np.mean(trace.stack[a][framed] == trace.stack[f][framed])) > 0.9


def _loss_between(labels: np.ndarray) -> None:
    """Relabel 'other' runs that sit between a forward run and the next backward run as loss."""
    from .segment import P, runs

    first, last, code, _ = runs(labels, np.zeros(len(labels), np.int32))
    telling = np.flatnonzero((code != P["zero_grad"]) & (code != P["other"]))
    for k in np.flatnonzero(code == P["other"]).tolist():
        j = np.searchsorted(telling, k)
        if 0 < j < len(telling) and code[telling[j - 1]] == P["forward"] and code[telling[j]] == P["backward"]:
            labels[first[k]:last[k] + 1] = P["loss"]


# -- lifetimes only ---------------------------------------------------------------------------------

K = 8


def step_period(trace: Trace) -> int | None:
    """The step length in allocations: the distance at which size k-grams recur perfectly regularly.

    A k-gram made once per step recurs at exactly the step length from the second step on (the
    first step differs: optimizer state, lazy workspaces); one made once per layer does not recur
    regularly, so it drops out.
    """
    periods = candidate_periods(trace)
    return periods[0] if periods else None


def candidate_periods(trace: Trace) -> list[int]:
    """Regular recurrence distances with a fair share of the votes, longest first.

    Checkpointed layers recur regularly too (their recompute), and in a trace holding barely more
    than one step only a layer's period is visible at all; the caller tries them longest first.
    """
    sizes = trace.size[trace.action == A["alloc"]].astype(np.uint64)
    if len(sizes) < 4 * K:
        return []
    h = np.zeros(len(sizes) - K + 1, np.uint64)
    for j in range(K):
        h = h * np.uint64(1_000_003) + sizes[j:len(sizes) - K + 1 + j]
    order = np.argsort(h, kind="stable")
    hs, pos = h[order], order
    same = hs[1:] == hs[:-1]
    gap = np.where(same, pos[1:] - pos[:-1], 0)
    # group boundaries
    start = np.flatnonzero(np.concatenate([[True], ~same]))
    count = np.diff(np.concatenate([start, [len(hs)]]))
    votes: dict[int, int] = {}
    for s, c in zip(start.tolist(), count.tolist()):
        if c < 2:
            continue
        g = gap[s:s + c - 1]
        steady = g[1:] if c >= 3 else g  # the first step may be longer
        if len(steady) and (steady == steady[0]).all() and steady[0] >= 4 * K:
            votes[int(steady[0])] = votes.get(int(steady[0]), 0) + 1
    if not votes:
        return []
    top = max(votes.values())
    return sorted((d for d, v in votes.items() if v >= 0.2 * top), reverse=True)


def _burst_freed(trace: Trace) -> np.ndarray:
    """Per event: a free inside a burst of at least BURST frees with no allocation between them.

    zero_grad(set_to_none=True) frees every gradient at once and a foreach optimizer drops its
    temporaries at once; backward frees activations one or two at a time between the gradients it
    allocates. So burst frees mark what is not an activation.
    """
    is_free = (trace.action == A["free_completed"]) | (trace.action == A["free"])
    group = np.cumsum(trace.action == A["alloc"])
    count = np.bincount(group, weights=is_free)
    return is_free & (count[group] >= BURST)


def mountains(trace: Trace, tl: Timeline, period_events: float | None = None,
              fill: bool = True) -> list[tuple[int, int, int]]:
    """(forward start, top, backward end) of each forward/backward pass, from activation lifetimes.

    Activations: allocations freed inside the trace, alive for more than a few events, and not
    freed in a burst (gradients, optimizer temporaries). Their live bytes rise through forward and
    fall through backward: one mountain per pass, its top where backward begins.
    """
    n = len(trace)
    life = tl.lifetimes
    born = (life.alloc_event >= 0) & (life.free_event < n)
    a, f, s = life.alloc_event[born], life.free_event[born], life.size[born]
    # Anything alive for most of a step is not one pass's activation (logits the loop keeps until
    # the next step, a batch prefetched a step ahead).
    max_span = SPAN * period_events if period_events else n
    act = (f - a >= 16) & (f - a < max_span) & ~_burst_freed(trace)[f]
    d = np.zeros(n + 1, np.int64)
    np.add.at(d, a[act], s[act])
    np.add.at(d, f[act], -s[act])
    curve = np.cumsum(d)[:n]
    if not len(curve) or curve.max() <= 0:
        return []
    out: list[tuple[int, int, int]] = []
    core = np.zeros(n, bool)  # events inside an accepted pass's core

    def climb(lo: int, hi: int) -> None:
        part = curve[lo:hi]
        # One point per run of equal values: the same peaks, found without scanning every event.
        first = np.flatnonzero(np.concatenate([[True], part[1:] != part[:-1]]))
        last = np.concatenate([first[1:], [len(part)]]) - 1
        peaks, _ = find_peaks(np.concatenate([[0], part[first], [0]]), prominence=0.3 * part.max())
        # The top is the plateau's last event: activations stop being made when the loss is done,
        # but the first is freed only once backward runs (zero_grad's frees in between are not theirs).
        peaks = lo + last[peaks - 1]
        # Highest first: a lesser peak inside an accepted pass (a ripple of backward, the loss's
        # spike) is part of that pass, not a pass of its own.
        # Most of its activations, not all: one tensor a loop holds across passes (the last
        # micro-batch's logits, kept through the optimizer) must not swallow the next pass.
        for p in peaks[np.argsort(-curve[peaks], kind="stable")].tolist():
            if core[p]:
                continue
            # allocations are in event order, and an activation lives less than max_span
            lo, hi = np.searchsorted(a, p - max_span, "left"), np.searchsorted(a, p, "right")
            alive = act[lo:hi] & (f[lo:hi] > p)
            if alive.any():
                pa, pf = a[lo:hi][alive], f[lo:hi][alive]
                out.append((int(pa.min()), p, int(pf.max())))
                core[int(np.quantile(pa, CORE)):int(np.quantile(pf, 1 - CORE)) + 1] = True

    climb(0, n)
    if not fill:
        return sorted(out)
    # A pass far lower than the highest (the first step, before the loop holds its logits across
    # steps) is no peak against the whole curve; look again, in each long stretch no pass covers.
    long = 0.5 * (period_events or (np.median([b1 - f0 for f0, _, b1 in out]) if out else n))
    edges = [-1] + [x for f0, _, b1 in sorted(out) for x in (f0, b1)] + [n]
    for g0, g1 in zip(edges[0::2], edges[1::2]):
        if g1 - g0 - 1 >= long and curve[g0 + 1:g1].max(initial=0) >= 0.1 * curve.max():
            climb(g0 + 1, g1)
    return sorted(out)


def _has_backward(a: np.ndarray, f: np.ndarray, f0: int, top: int) -> bool:
    """Backward frees the activations a forward saved, last made first freed: many alive at the top
    and freed in reverse order (rank correlation of alloc and free order < 0; -0.17 to -0.94 on the
    real training traces). Inference frees as it goes: a handful alive at its top (6 on a real GPT)."""
    lo, hi = np.searchsorted(a, f0, "left"), np.searchsorted(a, top, "right")  # a is in event order
    m = f[lo:hi] > top
    if m.sum() < MIN_SAVED:
        return False
    ra = np.argsort(np.argsort(a[lo:hi][m]))
    rf = np.argsort(np.argsort(f[lo:hi][m]))
    return float(np.corrcoef(ra, rf)[0, 1]) < 0


def _optimizer_start(trace: Trace, allocs: np.ndarray, params: np.ndarray, b1: int, end: int,
                     labels: np.ndarray) -> int:
    """Where the optimizer begins after a backward that ended at ``b1``.

    An optimizer works on blocks the parameters' sizes (its temporaries, its state). Backward's
    last gradients are such blocks too, right after its last activation is freed; then, in many
    loops, user code that allocates only other sizes -- gradient clipping's norms, GradScaler's
    unscale -- and only then the optimizer. Those last gradients are labelled backward here.
    """
    from .segment import P

    ours = allocs[np.searchsorted(allocs, b1, "right"):np.searchsorted(allocs, end, "right")]
    if len(params) < 3 or not len(ours):
        return b1 + 1
    sized = np.isin(trace.size[ours], params)
    if not sized.any():
        return b1 + 1
    other = np.flatnonzero(~sized)
    if len(other) and sized[other[0]:].any():
        labels[b1 + 1:ours[other[0]]] = P["backward"]
        return int(ours[other[0] + np.argmax(sized[other[0]:])])
    return int(ours[np.argmax(sized)])


def _keeps_gradients(trace: Trace, allocs: np.ndarray, params: np.ndarray, free_of: np.ndarray,
                     top: int, b1: int, nxt: int) -> bool:
    """Parameter-sized blocks made in this backward that outlive it (after the last pass: to the
    trace's end, since what a loop frees on its way out is no gradient)."""
    made = allocs[np.searchsorted(allocs, top, "right"):np.searchsorted(allocs, b1, "right")]
    made = made[np.isin(trace.size[made], params)]
    return int((free_of[made] > b1 if nxt < len(trace) else free_of[made] == nxt).sum()) >= 2


def _makes_gradients(trace: Trace, allocs: np.ndarray, params: np.ndarray, top: int, b1: int) -> bool:
    """A backward allocates a gradient the size of each trainable parameter; a forward keeping a
    KV cache (generate()) frees last-made-first too, but makes no such blocks. Measured share of the
    parameters' distinct sizes met after the top: training 0.33 (LoRA) to 1.0, inference 0 to 0.14.
    Without parameters made before the trace there is nothing to compare: no objection."""
    if len(params) < 3:
        return True
    made = trace.size[allocs[np.searchsorted(allocs, top, "right"):np.searchsorted(allocs, b1, "right")]]
    return float(np.isin(params, made).mean()) >= GRAD_SHARE


def passes(trace: Trace, tl: Timeline, mts: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """(forward start, top, backward end) of each pass, from the allocations alive across its top.

    What a forward saves for its backward is made after the previous pass's top and freed before
    the next one's, and alive across its own top, however long it lives: a checkpointed block's
    input lives through most of the step, so the span limit that found the tops does not apply
    here. The earliest of them starts the forward; the last freed ends the backward, unless it is
    freed after the next forward began (logits or a batch the loop holds until it is replaced).
    Burst frees are left out: zero_grad freeing the previous backward's gradients after this
    top would otherwise make them look saved.
    """
    n = len(trace)
    life = tl.lifetimes
    born = (life.alloc_event >= 0) & (life.free_event < n)
    a, f = life.alloc_event[born], life.free_event[born]
    # Burst frees are zero_grad's or the optimizer's, not backward's -- except inside the backward
    # the activation mountain already shows (the embedding's backward freeing several at once), of
    # what no backward made (gradients kept across micro-batches are made by the first backward).
    in_bwd = np.zeros(n + 1, np.int64)
    for _, top, b1 in mts:
        in_bwd[top + 1] += 1
        in_bwd[b1 + 1] -= 1
    in_bwd = np.cumsum(in_bwd) > 0
    burst = _burst_freed(trace)[f]
    keep = ~burst | (in_bwd[f] & ~in_bwd[a])
    size = life.size[born][keep]
    a, f = a[keep], f[keep]
    act = (f - a >= 16) & ~burst[keep]
    # parameter-sized ones are an optimizer's temporaries (grad², the update), not a recompute's
    act_a, act_f = a[act], f[act]
    act_p = np.isin(size[act], np.unique(life.size[life.alloc_event < 0]))
    bounds = [-1] + [top for _, top, _ in mts] + [n]
    # allocations are in event order: those made between two tops are one slice
    cut = np.searchsorted(a, bounds, "right")
    starts, crossing = [], []
    for k in range(1, len(bounds) - 1):
        fk = f[cut[k - 1]:cut[k]]
        c = (fk > bounds[k]) & (fk < bounds[k + 1])
        crossing.append(fk[c])
        starts.append(int(a[cut[k - 1]:cut[k]][c][0]) if c.any() else bounds[k])
    out = []
    for k, fc in enumerate(crossing):
        top = bounds[k + 1]
        nxt = starts[k + 1] if k + 1 < len(starts) else n
        out.append((starts[k], top, _backward_end(np.sort(fc[fc < nxt]), top, act_a, act_f, act_p)))
    return out


def loss_span(trace: Trace, free_of: np.ndarray, f0: int, top: int,
              allocs: np.ndarray | None = None) -> tuple[int, int] | None:
    """(first event of the loss, first of backward) in a training pass, from cross-entropy's trace.

    The loss allocates the log-softmax of the model's output (after an fp32 copy, under autocast),
    then the loss value, a tiny block or two; backward then allocates its seed (a tiny block) and
    the log-softmax's gradient, the log-softmax's size. Found on every real trace with a
    cross-entropy loss; any other loss leaves the pass without one (its forward runs to backward).
    """
    if allocs is None:
        allocs = np.flatnonzero(trace.action == A["alloc"])
    # The top may fall just before backward's seed (the previous loss value freed as the new one
    # is assigned): backward's first few allocations past it are searched too.
    lo, mid = np.searchsorted(allocs, f0, "left"), np.searchsorted(allocs, top, "right")
    idx = allocs[lo:mid + PAST]
    n_after = len(idx) - (mid - lo)
    if len(idx) < 4:
        return None
    sz = trace.size[idx]
    tiny = sz <= TINY
    for j in range(len(idx) - 1, max(len(idx) - 1 - LOOK - n_after, 0), -1):
        if tiny[j]:
            continue
        before = np.flatnonzero(~tiny[:j])
        if not len(before):
            return None
        i = int(before[-1])
        if sz[i] != sz[j] or j - i < 3:
            continue
        k = j - 1  # backward's seed, past a tiny block freed at once
        if free_of[idx[k]] - idx[k] <= QUICK and k - 1 > i and tiny[k - 1]:
            k -= 1
        if k - 1 <= i:  # the loss value must come between
            continue
        # the fp32 copy of half-precision logits made for the log-softmax and dropped at once
        if (i > 1 and sz[i - 1] == sz[i] and 2 * sz[i - 2] == sz[i]
                and free_of[idx[i - 1]] - idx[i - 1] <= 2 * QUICK):
            i -= 1
        return int(idx[i]), int(idx[k])
    return None


def _backward_end(frees: np.ndarray, top: int, act_a: np.ndarray, act_f: np.ndarray,
                  act_p: np.ndarray) -> int:
    """The last of a pass's saved-activation frees (sorted), less a straggling few after a long
    stretch in which no activations live and die: the loss or the batch a loop keeps until after
    the optimizer is no activation backward frees. (A checkpointed backward's last block is a long
    stretch between two such frees too, but full of its recompute's activations.)"""
    if not len(frees):
        return top
    best, end = 0, int(frees[-1])
    spacing = float(np.median(np.diff(frees))) if len(frees) > 2 else 0.0
    for k in range(1, min(TAIL, len(frees) - 1) + 1):
        g0, g1 = frees[-k - 1], frees[-k]
        # long against the backward, against the usual distance between its frees, and empty of
        # the activations a checkpointed block's recompute makes
        lo, hi = np.searchsorted(act_a, g0, "right"), np.searchsorted(act_a, g1, "left")
        inside = act_f[lo:hi] < g1
        recompute = int((inside & ~act_p[lo:hi]).sum())
        quiet = (g1 - g0 > max(STRAGGLE * (g0 - top), GAPS * spacing)
                 and (recompute < MIN_SAVED or recompute < int(inside.sum()) / 2))
        if quiet and g1 - g0 > best:  # the longest quiet stretch, not the first
            best, end = g1 - g0, int(g0)
    return end


def labels_from_lifetimes(trace: Trace, tl: Timeline) -> tuple[np.ndarray, list[int]]:
    """Phase codes per event and step starts (event indices) from lifetimes alone."""
    n_alloc = max(int((trace.action == A["alloc"]).sum()), 1)
    tries = []
    # Longest regular period first. A step holds its forward and backward: a period shorter than
    # the training passes it yields is a layer's, not a step's (in a trace of barely one step only
    # a layer's period is visible); then the next, then none.
    for period in candidate_periods(trace) + [None]:
        period_events = period * len(trace) / n_alloc if period else None
        labels, starts, lengths = _label_passes(trace, tl, period_events, fill=False)
        if lengths and (period_events is None or np.median(lengths) <= period_events):
            break
        tries.append(period_events)
    else:
        graphed = _graphed_steps(trace, tl)
        if graphed is not None:
            return graphed
        period_events = tries[0]
    if period_events is None:
        # No regular period (batches of varying length): the tops' usual spacing stands in for
        # it, so that what a loop holds for a whole step (the loss, kept for logging) is not
        # taken for an activation.
        tops = [top for _, top, _ in mountains(trace, tl, None, False)]
        if len(tops) >= 3:
            est = float(np.median(np.diff(tops)))
            labels2, starts2, lengths2 = _label_passes(trace, tl, est, fill=False)
            if lengths2 and np.median(lengths2) <= est:
                period_events = est
    labels, starts, _ = _label_passes(trace, tl, period_events)
    return labels, starts


def _fingerprints(trace: Trace, tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """Every place cross-entropy's fingerprint (see ``loss_span``) could be, anywhere in the trace:
    the loss's first event and backward's. Only where nothing else tells the loss (no forward
    events) is this trusted."""
    n = len(trace)
    life = tl.lifetimes
    born = (life.alloc_event >= 0) & (life.free_event < n)
    free_of = np.full(n, n, np.int64)
    free_of[life.alloc_event[born]] = life.free_event[born]
    allocs = np.flatnonzero(trace.action == A["alloc"])
    tiny = trace.size[allocs] <= TINY
    nt = np.flatnonzero(~tiny)
    if len(nt) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    i, j = nt[:-1], nt[1:]
    k = j - 1
    quick = (free_of[allocs[k]] - allocs[k] <= QUICK) & (k - 1 > i)
    k = np.where(quick, k - 1, k)
    ok = (trace.size[allocs[i]] == trace.size[allocs[j]]) & (j - i >= 3) & (k - 1 > i)
    return allocs[i[ok]], allocs[k[ok]]


def graphed_loss(trace: Trace, tl: Timeline, labels: np.ndarray) -> None:
    """With frames, a loss is the 'other' between a forward and its backward; a CUDA-graphed
    model's forward makes no events, so its loss is found by cross-entropy's fingerprint instead:
    'other' right before a backward that begins where a fingerprint says it does."""
    from .segment import P

    for l0, b0 in zip(*_fingerprints(trace, tl)):
        if labels[b0] == P["backward"] and (b0 == 0 or labels[b0 - 1] != P["backward"]) and (
                labels[l0:b0] == P["other"]).all():
            labels[l0:b0] = P["loss"]


def _graphed_steps(trace: Trace, tl: Timeline) -> tuple[np.ndarray, list[int]] | None:
    """Steps of a model whose forward and backward replay as CUDA graphs (``torch.compile``'s
    reduce-overhead mode, ``make_graphed_callables``): they make no events, so there is no pass to
    find, but the loss outside the graph leaves cross-entropy's fingerprint (see ``loss_span``) and
    a foreach optimizer its bursts. Each fingerprint followed by an optimizer's bursts is a step:
    loss, backward up to the optimizer's first burst-freed temporary, optimizer to its last."""
    from .segment import P

    n = len(trace)
    life = tl.lifetimes
    born = (life.alloc_event >= 0) & (life.free_event < n)
    loss0, bwd0 = _fingerprints(trace, tl)
    if not len(loss0):
        return None
    burst = _burst_freed(trace)
    params = np.unique(life.size[life.alloc_event < 0])
    temp = np.zeros(n, bool)  # allocations freed in a burst: an optimizer's temporaries
    temp[life.alloc_event[born][burst[life.free_event[born]]]] = True
    labels = np.zeros(n, np.int8)
    starts = [0]
    ends = np.concatenate([loss0[1:], [n]])
    steps = 0
    for l0, b0, nxt in zip(loss0.tolist(), bwd0.tolist(), ends.tolist()):
        t = np.flatnonzero(temp[b0:nxt])
        f = np.flatnonzero(burst[b0:nxt])
        if len(t) < BURST or len(f) < BURST:
            continue  # no optimizer after it: not a training step's loss
        o0, o1 = b0 + int(t[0]), b0 + int(f[-1])
        # an optimizer's temporaries are the parameters' sizes (a generate() loop's bursts are not)
        if len(params) >= 3 and np.isin(params, trace.size[b0 + t]).mean() < GRAD_SHARE:
            continue
        labels[l0:b0] = P["loss"]
        labels[b0:o0] = P["backward"]
        labels[o0:o1 + 1] = P["optimizer"]
        if steps:
            starts.append(l0)
        steps += 1
    return (labels, starts) if steps else None


def _label_passes(trace: Trace, tl: Timeline, period_events: float | None,
                  fill: bool = True) -> tuple[np.ndarray, list[int], list[int]]:
    """Labels, step starts, and the length in events of each training pass found."""
    from .segment import P

    n = len(trace)
    labels = np.zeros(n, np.int8)
    mts = mountains(trace, tl, period_events, fill)
    if not mts:
        return labels, [0], []
    mts = passes(trace, tl, mts)
    life = tl.lifetimes
    born = (life.alloc_event >= 0) & (life.free_event < n)
    la, lf = life.alloc_event[born], life.free_event[born]
    free_of = np.full(n, n, np.int64)
    free_of[la] = lf
    allocs = np.flatnonzero(trace.action == A["alloc"])
    params = np.unique(life.size[life.alloc_event < 0])  # what existed before: the parameters
    # A trace trains only if some backward leaves gradients behind: parameter-sized blocks made
    # after a top that outlive its pass (until zero_grad, or for good). An inference loop's
    # parameter-sized activations (a CNN's per-channel tensors) die within the pass.
    nexts = [f0 for f0, _, _ in mts[1:]] + [n]
    trains = len(params) < 3 or any(_keeps_gradients(trace, allocs, params, free_of, top, b1, nx)
                                    for (_, top, b1), nx in zip(mts, nexts))
    starts = [0]
    lengths = []
    burst = _burst_freed(trace)
    # Temporaries made and freed in bursts: a foreach optimizer's (or zero_grad's frees).
    made_here = np.zeros(n, bool)
    made_here[lf[burst[lf]]] = True
    first = mts[0][0]
    if made_here[:first].sum() >= BURST:
        # The trace starts inside a step (the ring buffer wrapped): its optimizer ends that step.
        last = int(np.flatnonzero(made_here[:first])[-1])
        labels[:last + 1] = P["optimizer"]
        starts.append(first)
    prev_end = -1
    for k, (f0, top, b1) in enumerate(mts):
        nxt = mts[k + 1][0] if k + 1 < len(mts) else n
        # Passes closer together than a step are micro-batches of one step (accumulation), unless
        # an optimizer's bursts come between them (a step made longer by an evaluation loop).
        if k and (period_events is None or f0 - starts[-1] >= 0.8 * period_events
                  or burst[prev_end + 1:f0].sum() >= BURST):
            starts.append(f0)
        prev_end = b1
        if not (trains and _has_backward(la, lf, f0, top) and _makes_gradients(trace, allocs, params, top, b1)):
            # No backward, so no optimizer either (inference) -- unless what follows makes
            # parameter-sized temporaries and frees them in bursts, as a foreach optimizer does
            # after a backward the trace cannot see (a CUDA-graphed model's replay makes no events).
            tail = np.arange(b1 + 1, nxt)
            made = allocs[(allocs > b1) & (allocs < nxt)]
            temps = made[burst[np.minimum(free_of[made], n - 1)] & (free_of[made] < nxt)]
            opt = len(temps) >= BURST and (len(params) < 3 or np.isin(params, trace.size[temps]).mean() >= GRAD_SHARE)
            labels[f0:nxt] = P["forward"]
            if opt:
                labels[b1 + 1:nxt] = P["optimizer"]
            continue
        lengths.append(b1 - f0)
        labels[f0:top + 1] = P["forward"]
        labels[top + 1:b1 + 1] = P["backward"]
        span = loss_span(trace, free_of, f0, top, allocs)
        if span and span[1] <= b1:
            labels[span[0]:span[1]] = P["loss"]
            labels[span[1]:b1 + 1] = P["backward"]
        # What follows backward up to the next forward is the optimizer, if it allocates at all --
        # up to its last burst of frees when it has them (a foreach optimizer's temporaries, or
        # zero_grad's); what allocates after that is a forward the loop ran with no backward (an
        # evaluation), the rest 'other'.
        tail = np.arange(b1 + 1, nxt)
        if len(tail) and (trace.action[tail] == A["alloc"]).any():
            bursts = np.flatnonzero(burst[tail])
            end = b1 + 1 + int(bursts[-1]) if len(bursts) >= BURST else nxt - 1
            labels[_optimizer_start(trace, allocs, params, b1, end, labels):end + 1] = P["optimizer"]
            rest = allocs[(allocs > end) & (allocs < nxt)]
            if len(rest) >= MIN_SAVED:
                labels[end + 1:nxt] = P["forward"]
    return labels, starts, lengths
