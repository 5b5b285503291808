"""Activation-checkpoint recompute: backward re-runs each checkpointed block's forward.

Recognised from sizes and lifetimes alone: a stretch of backward allocations that replays, in order,
sizes its own forward made and discarded (DISCARDED, MIN_REPLAYED) and frees them within backward;
frames, where the trace has them, must show it. The evidence, and the traces that taught each rule:
docs/patterns.md, ``checkpoint_recompute``.
"""
from __future__ import annotations

import numpy as np

from ...model import Pattern
from ...units import format_bytes
from ...vocab import P
from ..facts import Context, per_trace
from ..infer.frames import module_forwards, offload_unpacks, other_python
from ..sizes import in_sorted
from ..spans import concat_ranges
from .recompute_frames import (
    MIN_RUNS,
    checkpoint_positions,
    from_frames,
    from_rng_replays,
    recompute_calls,
    replay_positions,
    ripples,
    runs,
    span,
)
from .recompute_gathers import gathered
from .shape_kind import INK, ShapeKind

K = 4  # consecutive sizes that must match
MIN_RUN = 2 * K  # allocations in one recompute run
DISCARDED = 0.9  # share of the echoed forward allocations that forward had freed
GAP = 3  # a first-step allocation (a workspace) may split one run; rejoin across this many
#: Where at least this share of a candidate's allocations come from an offloading unpack hook
#: (infer.frames.offload_unpacks), the ripples are activations copied back, not recomputed:
#: h6_save_on_cpu has half (the other half are the gradients computed from them, no frames).
OFFLOADED = 0.25
#: Where no allocation of the runs is checkpoint's and at least this share are made by a module's
#: forward that the program calls itself (infer.frames.module_forwards), the program runs forward
#: again on its own: h15_gradcache_contrastive's chunks, encoded again with grad in its backward phase
#: (all of them), were "activation checkpointing at work".
OWN_FORWARD = 0.5
#: At least this share of a run's allocations are freed before its backward run ends: a recompute's
#: tensors serve that block's gradients and go. On the checkpointed fixtures every run frees 78-100 %
#: of its allocations inside backward (llama_hf_ckpt_bf16's shortest runs: 78 %); the runs of kept
#: gradients that echoed forward's sizes in heldout3_clip_infonce (no checkpointing) freed 0 %.
FREED_IN_BACKWARD = 0.5
#: Where Python frames are recorded, members with Python frames of their own that are none of
#: checkpoint's were made by other Python code (a custom Function's backward dequantising its weight
#: again): at least this share of such members and the ripples are not checkpoint's. A compiled
#: backward's recompute has no Python frames on its own allocations (heldout_gpt_compile_ckpt), so
#: members without any stay possible.
OTHER_PYTHON = 0.5
#: A recompute runs a block's forward again: the same allocations in the same order, temporaries included.
#: A run must repeat at least this many consecutive allocations of its own forward in one stretch, not
#: only K at a time. Activations copied back from the host (save_on_cpu) are only the saved tensors, in
#: backward's order, and gradients mirror the shapes of forward's: they repeat it in short stretches of
#: like sizes. Longest stretch, true recomputes: 9 (h10_reentrant_ckpt), 26 (pairs2/gpt__ckpt_2), 51-55
#: (HF Llama); false: 5 (offload_save_on_cpu, h6_save_on_cpu, without frames), 6 (dpo_llama's
#: backward echoing its reference's no_grad forward) (docs/accuracy.md, issue 40).
MIN_REPLAYED = 2 * K
#: Confidence of a claim from sizes and lifetimes alone (no checkpoint frame among the members). Before
#: the own-forward and freed-in-backward rules, sizes alone were right on 9 of the 11 frameless fixtures
#: where they claimed (h9_char_gpt_math_attention and heldout3_clip_infonce were wrong): 0.8.
SIZES_CONFIDENCE = 0.8


def _kgrams(sizes: np.ndarray, k: int) -> np.ndarray:
    s = sizes.astype(np.uint64)
    h = np.zeros(max(len(s) - k + 1, 0), dtype=np.uint64)
    for j in range(k):  # a rolling polynomial hash; uint64 wraps, which is what we want
        h = h * np.uint64(1_000_003) + s[j:len(s) - k + 1 + j]
    return h


def _kgrams_of(ctx: Context, idx: np.ndarray, step_grams) -> np.ndarray:
    """_kgrams of the sizes of allocations ``idx``: a slice of the step's k-grams (``step_grams``:
    first allocation, hashes; made once per step) where they are consecutive allocations inside it,
    as a backward run's are."""
    lo, grams = step_grams
    i0 = int(idx[0]) - lo
    if int(idx[-1]) - int(idx[0]) != len(idx) - 1 or i0 < 0 or i0 + len(idx) - K + 1 > len(grams):
        return _kgrams(ctx.size[idx], K)  # not one stretch (forward runs split by other phases)
    return grams[i0:i0 + len(idx) - K + 1]


def _size_runs(ctx: Context, fwd: np.ndarray, bwd: np.ndarray, b0: int, b1: int,
               step_grams=(0, np.zeros(0, np.uint64))) -> list[tuple[int, int]]:
    """The runs of backward allocations (positions in ``bwd``, made in the backward run b0..b1) whose
    sizes repeat, K at a time, forward allocations that forward had mostly discarded (DISCARDED) before
    backward began, and which backward mostly frees before b1 (FREED_IN_BACKWARD)."""
    if len(fwd) < K or len(bwd) < K:
        return []
    hf, hb = _kgrams_of(ctx, fwd, step_grams), _kgrams_of(ctx, bwd, step_grams)
    order = np.argsort(hf, kind="stable")
    pos = np.minimum(np.searchsorted(hf[order], hb), len(hf) - 1)
    hit = hf[order][pos] == hb
    if not hit.any():
        return []  # no run can form (most backward runs of a network without checkpointing)
    fpos = order[pos]  # first forward k-gram with the same sizes
    discarded = np.concatenate([(ctx.free[fwd] < b0).astype(np.float64), np.zeros(K)])
    csum = np.concatenate([[0.0], np.cumsum(discarded)])
    disc_share = (csum[fpos + K] - csum[fpos]) / K
    covered = np.zeros(len(bwd), dtype=bool)
    for j in range(K):  # every allocation inside a matching k-gram is a candidate
        covered[j:len(hit) + j] |= hit
    starts, stops = runs(covered, GAP)
    # per run, the matching k-grams that start in it (a..max(b-K+1, a+1)) and their mean share
    # discarded, from running sums (the shares are quarters: their sums are exact)
    hits = np.concatenate([[0], np.cumsum(hit)])
    shares = np.concatenate([[0.0], np.cumsum(np.where(hit, disc_share, 0.0))])
    ends = np.maximum(stops - K + 1, starts + 1)
    count = hits[ends] - hits[starts]
    ok = (stops - starts >= MIN_RUN) & (count > 0)
    ok[ok] = (shares[ends[ok]] - shares[starts[ok]]) / count[ok] >= DISCARDED
    # freed within backward (b1: the backward run's last event), as a recompute's tensors are
    freed = np.concatenate([[0], np.cumsum(ctx.free[bwd] <= b1)])
    ok &= (freed[stops] - freed[starts]) >= FREED_IN_BACKWARD * np.maximum(stops - starts, 1)
    if ok.any():
        ok &= _replays(ctx.size[fwd], ctx.size[bwd], starts, stops)
    return list(zip(starts[ok].tolist(), stops[ok].tolist()))


def _replays(fwd_sizes: np.ndarray, bwd_sizes: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Per run ``bwd[starts[i]:stops[i]]``: does it hold MIN_REPLAYED consecutive sizes that its forward
    made consecutively too (a forward replayed, not echoed K sizes at a time)?"""
    if len(fwd_sizes) < MIN_REPLAYED or len(bwd_sizes) < MIN_REPLAYED:
        return np.zeros(len(starts), bool)
    hb = _kgrams(bwd_sizes, MIN_REPLAYED)
    hits = np.concatenate([[0], np.cumsum(in_sorted(hb, np.unique(_kgrams(fwd_sizes, MIN_REPLAYED))))])
    first = np.minimum(starts, len(hb))
    return hits[np.clip(stops - MIN_REPLAYED + 1, first, len(hb))] > hits[first]


@per_trace
def echoing_runs(ctx: Context) -> set[int]:
    """The first events of the backward runs with some K sizes in a row that their own forward
    (own_forward) made in a row too, every run at once: only these can hold ripples by sizes
    (_size_runs). A few more may be named (hashes are compared by a key mixed with the run), none missed."""
    n_steps = len(ctx.seg.steps)
    in_steps = (ctx.run_step >= 0) & (ctx.run_step < n_steps)
    b = np.flatnonzero((ctx.run_phase == P["backward"]) & in_steps)
    b = b[np.lexsort((ctx.run_first[b], ctx.run_step[b]))]
    f = np.flatnonzero((ctx.run_phase == P["forward"]) & in_steps)
    f = f[np.lexsort((ctx.run_first[f], ctx.run_step[f]))]
    if not len(b) or not len(f):
        return set()
    # a forward run is its step's next backward run's own (the backward runs between are none)
    width = ctx.n + 1
    j = np.searchsorted(ctx.run_step[b] * width + ctx.run_first[b], ctx.run_step[f] * width + ctx.run_last[f])
    owned = (j < len(b)) & (ctx.run_step[b][np.minimum(j, len(b) - 1)] == ctx.run_step[f])
    f, j = f[owned], j[owned]
    f, j = f[np.argsort(j, kind="stable")], np.sort(j, kind="stable")
    fkeys, bkeys = (_grams_by_group(ctx, ctx.run_first[r], ctx.run_last[r], g)
                    for r, g in ((f, j), (b, np.arange(len(b)))))
    # a binary search each in the forward's keys (np.isin sorted both together: 28 ms against 7 at 1M events)
    hit = np.unique(bkeys[1][in_sorted(bkeys[0], np.unique(fkeys[0]))])
    return set(ctx.run_first[b][hit].tolist())


def _grams_by_group(ctx: Context, first: np.ndarray, last: np.ndarray, group: np.ndarray):
    """(key, group) of every K-gram of sizes inside one group's allocations, the allocations of runs
    first..last taken in order; the key mixes the hash with the group."""
    lo, hi = ctx.alloc.searchsorted(first), ctx.alloc.searchsorted(last + 1)
    k, idx = concat_ranges(lo, hi)
    g = group[k]
    h = _kgrams(ctx.size[idx], K)
    inside = g[:len(h)] == g[K - 1:K - 1 + len(h)]  # groups are runs in g: the window's ends share one
    g = g[:len(h)][inside]
    return h[inside] * np.uint64(0x9E3779B97F4A7C15) + g.astype(np.uint64), g


def own_forward(fwd_runs, bwd_runs, b0: int) -> list[tuple[int, int]]:
    """The forward runs that the backward run starting at ``b0`` differentiates: those after the step's
    previous backward run and before ``b0``. With accumulated micro-batches each backward has its own."""
    prev = max((b for _, b in bwd_runs if b < b0), default=-1)
    return [(a, b) for a, b in fwd_runs if prev < a and b < b0]


def detect(ctx: Context, step: int) -> list[Pattern]:
    """The ripples in each of the step's backward runs: checkpointing's recompute, or forward run again."""
    out: list[Pattern] = []
    fwd_runs = ctx.runs_of(step, "forward")
    bwd_runs = ctx.runs_of(step, "backward")
    echoing = echoing_runs(ctx)
    told = len(checkpoint_positions(ctx)) or len(replay_positions(ctx))
    echoes = echoing.intersection(b0 for b0, _ in bwd_runs)
    if not echoes and not told:  # (most steps of most traces) no run by sizes, nothing to tell one by frames
        return out
    step_grams = _step_grams(ctx, fwd_runs, bwd_runs) if echoes else None
    for b0, b1 in bwd_runs:
        bwd = ctx.allocs_between(b0, b1)
        good = _echoed(ctx, fwd_runs, bwd_runs, bwd, b0, b1, step_grams) if b0 in echoing else []
        kept = bwd
        if good:  # FSDP2's parameters gathered again are no recompute: the runs without them
            kept, good = _without_gathers(ctx, fwd_runs, bwd_runs, bwd, b0, b1, step_grams, good)
        if len(good) < MIN_RUNS:
            if not told:
                continue  # no allocation of checkpoint's or of a replay anywhere: neither can tell a run
            # A recompute too short to repeat K sizes in a row (a selective policy saves the matmuls,
            # a checkpointed loss chunk makes two blocks) is still told by checkpoint's own frames.
            found = from_frames(ctx, step, bwd, b1) or from_rng_replays(ctx, step, bwd, b1)
            if found is not None:
                out.append(found)
            continue
        members = np.concatenate([kept[a:b] for a, b in good])
        if float(np.mean(_offloaded(ctx)[ctx.alloc[members]])) >= OFFLOADED:
            continue
        first, last, per_layer = span(ctx, kept, [a for a, _ in good], [b for _, b in good], b1)
        # An unpack hook is Python, so where the trace has stack frames offloading was ruled out above
        # (a compiled backward's recompute has none on its own allocations); without any, it cannot be.
        framed = _has_frames(ctx)
        count = len(good)
        blocks = recompute_calls(ctx, bwd)
        if blocks is not None:
            count, per_layer = blocks
        own = blocks is None and framed and float(np.mean(
            _own_forwards(ctx)[ctx.trace.stack[ctx.alloc[members]]])) >= OWN_FORWARD
        if blocks is None and framed and not own and not _replayed_in(ctx, bwd):
            continue  # frames recorded, and none of checkpoint's or of a compiled replay in this backward: sizes alone are no evidence
        if blocks is None and framed and not own and float(np.mean(
                _other_python(ctx)[ctx.trace.stack[ctx.alloc[members]]])) >= OTHER_PYTHON:
            continue  # Python code other than checkpoint's made them: the frames say who, and it is not checkpointing
        run_events = [[int(ctx.alloc[kept[a]]), int(ctx.alloc[kept[b - 1]])] for a, b in good]
        if own:
            out.append(ripples(ctx, step, first, last, per_layer, _own_words(count, per_layer), members,
                               {"count": count, "bytes_per_layer": per_layer, "framed": True, "run_events": run_events},
                               kind="forward_rerun"))
            continue
        out.append(ripples(
            ctx, step, first, last, per_layer, _sized_words(framed, count, per_layer), members,
            {"count": count, "bytes_per_layer": per_layer, "framed": framed, "run_events": run_events,
             "evidence": "sizes" if blocks is None else "frames"},
            confidence=SIZES_CONFIDENCE if blocks is None else 1.0))
    return out


@per_trace
def _offloaded(ctx: Context) -> np.ndarray:
    """Per event: made by an offloading unpack hook (infer.frames.offload_unpacks)."""
    return offload_unpacks(ctx.trace)


@per_trace
def _has_frames(ctx: Context) -> bool:
    return bool((ctx.trace.stack >= 0).any())


@per_trace
def _own_forwards(ctx: Context) -> np.ndarray:
    """Per stack id: made by a module's forward that the program calls itself (infer.frames.module_forwards)."""
    return module_forwards(ctx.trace)


@per_trace
def _other_python(ctx: Context) -> np.ndarray:
    """Per stack id: Python frames of its own, none of checkpoint's (infer.frames.other_python)."""
    return other_python(ctx.trace)


def _replayed_in(ctx: Context, bwd: np.ndarray) -> bool:
    """Whether any of the backward run's allocations ``bwd`` is a compiled backward's RNG replay."""
    at = replay_positions(ctx)
    return bool(len(at)) and bool(in_sorted(bwd, at).any())


def _sized_words(framed: bool, count: int, per_layer: int) -> str:
    """The ripples' words where sizes found the runs: checkpointing where frames show it, else what could be."""
    what = ("Activation checkpointing at work: backward re-runs the forward of each checkpointed block "
            "before differentiating it" if framed else
            "Backward makes forward's discarded tensors again, block by block, before differentiating each "
            "block: activation checkpointing's recompute (or activations offloaded to the host and copied "
            "back, e.g. save_on_cpu, or the program running forward again itself, as gradient caching does, or a "
            "custom backward that dequantises frozen weights again; the trace has no stack frames to tell)")
    return (f"{what}, {count} times here, allocating about {format_bytes(per_layer)} "
            f"per block and freeing it as backward moves on — the ripples. This trades compute for "
            + ("memory; checkpoint fewer blocks if memory allows, to run faster." if framed else
               "memory; if it is checkpointing, checkpointing fewer blocks runs faster where memory allows."))


def _step_grams(ctx: Context, fwd_runs, bwd_runs) -> tuple[int, np.ndarray]:
    """The step's k-grams hashed once, sliced per run (not kept: 8 bytes an allocation), from its first allocation."""
    lo = int(ctx.alloc.searchsorted(min(r[0] for r in fwd_runs + bwd_runs)))
    hi = int(ctx.alloc.searchsorted(max(r[1] for r in fwd_runs + bwd_runs) + 1))
    return lo, _kgrams(ctx.size[lo:hi], K)


def _echoed(ctx: Context, fwd_runs, bwd_runs, bwd: np.ndarray, b0: int, b1: int, step_grams) -> list[tuple[int, int]]:
    """_size_runs of the backward run b0..b1 (its allocations ``bwd``) against its own forward."""
    runs = [ctx.allocs_between(a, b) for a, b in own_forward(fwd_runs, bwd_runs, b0)]
    fwd = np.concatenate(runs) if runs else np.zeros(0, np.int64)
    return _size_runs(ctx, fwd, bwd, b0, b1, step_grams)


def _without_gathers(ctx: Context, fwd_runs, bwd_runs, bwd: np.ndarray, b0: int, b1: int, step_grams, good):
    """(allocations, runs): the backward run's allocations less FSDP2's copy-outs (gathered) found in its
    runs ``good``, and the runs found again without them; the same where there are none."""
    kept = bwd
    while good:
        drop = gathered(ctx, np.concatenate([kept[a:b] for a, b in good]))
        fewer = kept[~in_sorted(kept, drop)] if len(drop) else kept
        if len(fewer) == len(kept):
            return kept, good
        kept = fewer
        good = _echoed(ctx, fwd_runs, bwd_runs, kept, b0, b1, step_grams)
    return kept, good


def _own_words(count: int, per_run: int) -> str:
    """The ripples' words where the program calls the model's forward again itself (no checkpoint frames)."""
    return (f"Forward runs again in the backward phase, called by the program itself, not by torch.utils.checkpoint: "
            f"{count} runs here, each allocating about {format_bytes(per_run)} and freeing it before the next — the "
            f"ripples (gradient caching, which encodes chunk by chunk again with grad, works so; so does any loop that "
            f"re-runs a module before calling backward on its output). Memory stays at one run's activations; the "
            f"price is the forward computed twice.")


#: What a checkpoint_recompute's figure measures: a block's recompute, or, told by a compiled backward's
#: RNG replays, only those ops' blocks of each region.
PER_LAYER, PER_REGION = "per layer", "per region"


def _ripples_are(details: dict) -> str:
    return PER_REGION if details.get("evidence") == "rng_replay" else PER_LAYER


KINDS = (
    ShapeKind("checkpoint_recompute", detect, per_step=True, marker="s", colour=INK, priority=60,
              size_label=_ripples_are,
              explanation="Activation checkpointing: backward re-runs each checkpointed block's forward before "
                          "differentiating it (the ripples).", order=40),
    ShapeKind("forward_rerun", detect, per_step=True, marker="<", colour=INK, priority=70, size_label=PER_LAYER,
              explanation="Forward run again in the backward phase by the program itself, not by a checkpoint "
                          "(gradient caching): the same ripples.", order=50),
)
