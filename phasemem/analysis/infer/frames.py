"""Phases from stack frames: which code made each allocation.

Backward runs on the autograd engine's thread, whose events carry no Python frames, except Python
run there: activation-checkpoint recompute (``unpack_hook``/``recompute_fn``), a custom or compiled
Function's backward, backward hooks and callbacks (FSDP2's all-gathers and reduce-scatters), and
the loss's first gradient (``_make_grads``). The optimizer's events run
under ``torch/optim/``, zero_grad under a ``zero_grad`` frame, the model's forward under
``nn.Module._call_impl``; everything else with frames (data, logging, the loss outside the model)
is 'other'.
"""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace, is_workspace_frame
from ...vocab import P
from ..timeline import Timeline

# Event classes from frames.
NONE, FWD, OPT, ZG, BWD_PY, OTHER = range(6)
#: Below this share of allocations with Python frames, the frames are not the default context.
#: Counted over allocations, not events: recorded with context="alloc" (and, on Windows, by
#: magma27_cs336 in ../shared/wild) frees carry no frames, and backward's allocations never do, so
#: a forward + backward trace with every main-thread allocation framed had 0.275 of its events
#: framed but 0.38 of its allocations.
FRAMES_USABLE = 0.3


def _python(frames):
    # stacks="all" (torch's default) adds C++ frames to every event, the autograd thread's too; the
    # thread is told by its Python frames alone.
    return [f for f in frames if f[0].endswith(".py")]


def per_stack(trace: Trace, of_stack, dtype=bool, none=False) -> np.ndarray:
    """``of_stack(frames)`` per distinct stack, indexed by stack id (id -1, no frames, is the last:
    ``none``). Index it with ``trace.stack[events]`` where only some events are asked about: a
    per-event array is n bytes more for the whole analysis (10 MB at 10M events)."""
    out = np.empty(len(trace.stacks) + 1, dtype)
    out[-1] = none  # stack id -1
    for sid, frame_ids in enumerate(trace.stacks):
        out[sid] = of_stack([trace.frames[f] for f in frame_ids])
    return out


def per_event(trace: Trace, of_stack, dtype=bool, none=False) -> np.ndarray:
    """``of_stack(frames)`` (frames innermost first, as (filename, line, name)) for every event: one
    Python call per distinct stack, not per event; ``none`` for events without frames."""
    return per_stack(trace, of_stack, dtype, none)[trace.stack]


def frame_classes(trace: Trace) -> np.ndarray:
    """A class per event from its stack's Python frames."""
    return per_event(trace, lambda fr: classify_frames(py) if (py := _python(fr)) else NONE, np.int8, NONE)


def has_python(trace: Trace) -> np.ndarray:
    """Per event: does its stack hold a Python frame."""
    return per_event(trace, lambda fr: any(fn.endswith(".py") for fn, _, _ in fr))


def classify_frames(frames) -> int:
    """The event class (FWD, OPT, ZG, BWD_PY, OTHER) that a stack's Python frames, innermost first, give."""
    # Python run by the autograd engine: checkpoint recompute, a custom or compiled Function's
    # backward, the loss's first gradient.
    if any(nm in ("unpack_hook", "recompute_fn", "_make_grads") for _, _, nm in frames):
        return BWD_PY
    out_fn, _, out_nm = frames[-1]  # the engine calls a Function's backward with nothing above it
    if out_nm == "apply" and out_fn.endswith("torch/autograd/function.py"):
        return BWD_PY
    # ... or a backward hook, or a callback queued for backward's end (FSDP2's ``_pre_backward``
    # all-gathers, ``_root_post_backward_final_callback`` reduce-scatters): on the main thread the
    # outermost frame is the script's ``<module>`` (or a thread's bootstrap), never one of those.
    if "backward" in out_nm.lower():
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
            if fn.endswith("torch/optim/optimizer.py") and _own_step(frames, k):
                return OPT
            return OTHER if users > 0 else OPT
        if nm == "_call_impl" and fn.endswith("torch/nn/modules/module.py"):
            return FWD
        # A model that calls its blocks' forward() directly skips _call_impl (silmont_memory_forward_*
        # in ../shared/wild: every block's events had only forward frames above the script).
        if nm == "forward" and _is_user(fn):
            return FWD
        users += _is_user(fn)
    return OTHER


def _own_step(frames, k: int) -> bool:
    """Whether the frames inside torch's step wrapper (``frames[k]``) are a subclass's own step in
    the user's code and what it calls, not a closure the step runs.

    Decorators in between (``@torch.no_grad()`` is ``_contextlib.decorate_context``) are skipped:
    Muon in heldout13 is decorated so, and calls a Newton-Schulz helper from its step. A closure
    is told by its name (``closure``, as torch's docs and LBFGS users write it, and Lightning's
    ``Closure``) or by another library's frames (Lightning's loop) among those inside."""
    j = k - 1
    while j >= 0 and frames[j][0].replace("\\", "/").endswith(DECORATOR_FILES):
        j -= 1
    if j < 0 or not _is_user(frames[j][0]):
        return False
    return not any("closure" in nm.lower() or not (_is_user(f) or _is_torch(f)) for f, _, nm in frames[:j])


#: torch's files whose frames sit between a decorated function and its caller.
DECORATOR_FILES = ("torch/utils/_contextlib.py",)


def _is_torch(fn: str) -> bool:
    fn = fn.replace("\\", "/")
    return "/torch/" in fn or fn.startswith("torch/")


def _is_user(fn: str) -> bool:
    fn = fn.replace("\\", "/")
    return not (_is_torch(fn) or "site-packages/" in fn or "dist-packages/" in fn)


def has_usable_frames(trace: Trace) -> bool:
    allocs = trace.action == A["alloc"]
    if not allocs.any():
        return False
    return float(np.mean(has_python(trace)[allocs])) >= FRAMES_USABLE


def labels_from_frames(trace: Trace, tl: Timeline | None = None) -> np.ndarray:
    """Phase codes (vocab.P order) per event from frames; ``tl``: the trace's timeline, if already made."""
    cls = frame_classes(trace)
    lut = np.array([P["backward"], P["forward"], P["optimizer"], P["zero_grad"], P["backward"], P["other"]], np.int8)
    labels = lut[cls]
    # Recorded with context="alloc", frees carry no frames of their own: a free then takes the
    # phase of the allocations around it when they agree, else 'other'.
    is_alloc = trace.action == A["alloc"]
    if is_alloc.any() and frees_say_nothing(trace, tl):
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


def frees_say_nothing(trace: Trace, tl: Timeline | None) -> bool:
    """True when free events carry no thread evidence: recorded with context="alloc", a free has no
    frames or repeats its allocation's frames."""
    is_alloc = trace.action == A["alloc"]
    frees = ~is_alloc & np.isin(trace.action, [A["free_requested"], A["free_completed"], A["free"]])
    if not frees.any():
        return False
    if float(np.mean(has_python(trace)[frees])) < 0.05:
        return True
    life = (tl or Timeline.from_trace(trace)).lifetimes
    pair = life.paired
    a, f = life.alloc_event[pair], life.free_event[pair]
    framed = trace.stack[a] >= 0
    return bool(framed.any()) and float(np.mean(trace.stack[a][framed] == trace.stack[f][framed])) > 0.9


#: Frames under which an allocation is a module's weights being placed on the device:
#: ``model.to()``/``.cuda()`` (``Module._apply``) and ``load_state_dict``.
_WEIGHT_FRAMES = ("_apply", "load_state_dict", "_load_from_state_dict")


def weight_moves(trace: Trace) -> np.ndarray:
    """Per event: does its stack say it places a module's weights on the device (see _WEIGHT_FRAMES)?
    sqattn_cuda in ../shared/wild moves each decoder layer to the GPU before running it; without
    this those weights looked like the batch ('input')."""
    return per_event(trace, lambda fr: any(nm in _WEIGHT_FRAMES and fn.endswith("torch/nn/modules/module.py")
                                           for fn, _, nm in fr))


def copies(trace: Trace) -> tuple[np.ndarray, bool]:
    """(per event: does its stack say it copies a tensor (``at::native::_to_copy``: ``.to()``,
    ``.cuda()``, a dtype cast), do the stacks carry C++ frames at all). Recorded with torch's
    default ``stacks="all"``, a batch moved to the device says so; a buffer the loop makes with
    ``torch.empty`` (h5_gpt_decode_kv's KV cache) does not."""
    copy = per_event(trace, lambda fr: any(nm.startswith("at::native::_to_copy") for _, _, nm in fr))
    cpp = any(fn == "??" or not fn.endswith(".py") for fn, _, _ in trace.frames)
    return copy, cpp


def inside_file(trace: Trace, files: tuple[str, ...]) -> np.ndarray:
    """Per event: does its stack run through one of these files (e.g. an optimizer's step())?"""
    return per_event(trace, lambda fr: any(fn.endswith(files) for fn, _, _ in fr))


def loss_seeds(trace: Trace) -> np.ndarray:
    """Per event: is it made by ``torch.autograd``'s ``_make_grads``: the loss's seed gradient
    (``ones_like(loss)``), made as backward starts and freed when it returns. No parameter's gradient,
    though it outlives the backward run where a compiled or graphed backward makes no other event
    (h8_compile_reduce_overhead: 3 such 4-byte blocks were "gradients, 12 B")."""
    return per_event(trace, lambda fr: any(nm == "_make_grads" for _, _, nm in fr))


def offload_unpacks(trace: Trace) -> np.ndarray:
    """Per event: is it made by a saved-tensor unpack hook that is not checkpointing's: activations
    copied back from the host in backward (``torch.autograd.graph.save_on_cpu``'s
    ``unpack_from_cpu``, h6_save_on_cpu; an offloading hook of one's own named ``unpack...``). They
    echo forward's sizes in forward's order, as checkpoint recompute does, and are not it."""
    return per_event(trace, lambda fr: any("unpack" in nm and fn.endswith(".py")
                                           and not fn.endswith("torch/utils/checkpoint.py") for fn, _, nm in fr)
                     and not any(nm == "recompute_fn" for _, _, nm in fr))


_ENGINE = (("torch/autograd/graph.py", "_engine_run_backward"), ("torch/autograd/__init__.py", "backward"),
           ("torch/autograd/__init__.py", "grad"))


def checkpoint_recomputes(trace: Trace) -> np.ndarray:
    """Per stack id (``per_stack``): is an event with it made by checkpoint's recompute of a block's
    forward? Its stack runs through torch/utils/checkpoint.py with no autograd engine call nearer the
    top: reentrant checkpointing runs the block's backward inside ``CheckpointFunction.backward`` too
    (``torch.autograd.backward`` from there, then the engine: h10_reentrant_ckpt,
    h10_hf_reentrant_ckpt), and that is no recompute."""
    def recompute(fr):
        for fn, _, nm in fr:  # innermost first
            if fn.endswith("torch/utils/checkpoint.py"):
                return True
            if any(fn.endswith(f) and nm == n for f, n in _ENGINE):
                return False
        return False

    return per_stack(trace, recompute)


#: torch.compile's replay of a random op with the forward's saved RNG state (``run_with_rng_state``)
#: and its saving (``run_and_save_rng_state``) run through this file; both show the same frames, so
#: only the phase tells them apart (fixtures/fsdp2: 5 blocks per checkpointed block, forward and backward).
RNG_REPLAY_FILE = "torch/_prims/rng_prims.py"


def rng_replays(trace: Trace) -> np.ndarray:
    """Per stack id (``per_stack``): does the stack run through torch.compile's RNG-state wrapper
    (RNG_REPLAY_FILE)? Inside backward, such a block is a forward's random op computed again with the
    state the forward saved: the recompute of a checkpointed region inside a compiled backward, whose
    other ops carry no frame that says so."""
    return per_stack(trace, lambda fr: any(fn.replace("\\", "/").endswith(RNG_REPLAY_FILE) for fn, _, _ in fr))


def other_python(trace: Trace) -> np.ndarray:
    """Per stack id (``per_stack``): was the event made by Python code that is not checkpoint's (no frame
    in torch/utils/checkpoint.py) and not a compiled graph's (COMPILED_FILES: which op made a block is not
    in those frames)? A custom autograd Function's backward that dequantises its int8 weight again makes
    forward-sized blocks in backward under its own frames; checkpoint's recompute never does. False
    where the stack has no Python frame (the autograd engine's own allocations: nothing tells)."""
    def other(fr):
        py = _python(fr)
        return bool(py) and not any(fn.endswith("torch/utils/checkpoint.py") or
                                    any(part in fn.replace("\\", "/") for part in COMPILED_FILES) for fn, _, _ in py)

    return per_stack(trace, other)


def _in_module(frames) -> bool:
    """Does the stack run through an ``nn.Module`` call (torch/nn/modules/module.py)?"""
    return any(fn.endswith("torch/nn/modules/module.py") for fn, _, _ in frames)


def module_forwards(trace: Trace) -> np.ndarray:
    """Per stack id (``per_stack``): is the event made by a module's forward that the program itself
    calls, not checkpoint's recompute (no frame in torch/utils/checkpoint.py)? Where backward's ripples
    are such allocations, the program runs forward again on its own (gradient caching:
    h15_gradcache_contrastive encodes each chunk again with grad inside its backward phase), and that
    is no activation checkpointing."""
    return per_stack(trace, lambda fr: _in_module(fr) and not any(fn.endswith("torch/utils/checkpoint.py")
                                                                   for fn, _, _ in fr))


def outside_modules(trace: Trace) -> np.ndarray:
    """Per stack id (``per_stack``): do the stack's Python frames run through no ``nn.Module`` call?
    False where the event has no Python frames (nothing tells). A model's head makes its logits inside the model's
    forward; a contrastive loss computes its scores in the loop itself (h10_moco_queue)."""
    return per_stack(trace, lambda fr: bool(py := _python(fr)) and not _in_module(py))


#: Where weights are made: module construction and moves, and the loaders of model files. A block an
#: inference trace makes before its first forward and keeps is a weight only from one of these.
WEIGHT_SOURCES = ("torch/nn/", "torch/serialization.py", "transformers/", "accelerate/", "safetensors/",
                  "peft/", "timm/", "torchvision/")


def weight_sources(trace: Trace) -> np.ndarray:
    """Per stack id (``per_stack``): could an event with it make a weight? True without Python frames
    (nothing tells), else where a frame runs through WEIGHT_SOURCES. A KV cache a script makes with
    ``torch.zeros`` before decoding (gpt-fast's ``setup_caches``, h12_static_kv_decode) is none; a
    model moved (``module._apply``) or loaded (``transformers``' loader thread) is."""
    def source(fr):
        py = _python(fr)
        return not py or any(part in fn for fn, _, _ in py for part in WEIGHT_SOURCES)

    return per_stack(trace, source, none=True)


#: Frames that show a linear layer made a block, as an LM head makes its logits: ``nn.Linear``'s
#: file, torch's matmul-like Python functions (``F.linear``, ``torch.einsum``, which a hand-written
#: Linear calls: wild/magma27_cs336) and the matmul kernels' C++ names. A segmentation net's
#: per-pixel scores come from ``F.interpolate`` or a 1x1 conv (h13_multiscale_seg: "the LM head's
#: output ... vocabulary scores" was untrue there).
LINEAR_FILES = ("torch/nn/modules/linear.py",)
LINEAR_NAMES = ("linear", "einsum", "matmul", "bmm", "mm")
LINEAR_CPP = ("addmm", "at::native::linear", "mm_out", "at::_ops::mm", "matmul", "einsum")
#: Python frames of a compiled graph: which op made a block is not in them (inductor allocates its
#: outputs with empty_strided and fills them later).
COMPILED_FILES = ("torch/_inductor/", "torch/_functorch/", "torch/_dynamo/")
#: made_by_linear's answers
LINEAR, NOT_LINEAR, UNKNOWN = 1, 0, -1


def made_by_linear(trace: Trace) -> np.ndarray:
    """Per stack id (``per_stack``, int8): LINEAR where the frames show a linear layer or a matmul
    made the block, NOT_LINEAR where they show the op and it is none of those, UNKNOWN without
    frames or inside a compiled graph."""
    def of(fr):
        fr = [(fn.replace("\\", "/"), nm) for fn, _, nm in fr]
        for fn, nm in fr:
            if fn.endswith(".py"):
                if fn.endswith(LINEAR_FILES) or ("/torch/" in fn and nm in LINEAR_NAMES):
                    return LINEAR
            elif any(k in nm for k in LINEAR_CPP):
                return LINEAR
        if not fr or any(part in fn for fn, _ in fr for part in COMPILED_FILES):
            return UNKNOWN
        return NOT_LINEAR

    return per_stack(trace, of, np.int8, UNKNOWN)


def innermost_function(trace: Trace, stack_id: int) -> str | None:
    """The innermost Python function of a stack (the op that made a block: ``interpolate``), or
    None where the stack has no Python frame."""
    py = _python([trace.frames[f] for f in trace.stacks[stack_id]]) if stack_id >= 0 else []
    return py[0][2] if py else None


def workspace_stacks(trace: Trace) -> np.ndarray:
    """Per stack id (``per_stack``): does a C++ frame name a math library's workspace getter
    (``trace.WORKSPACE_FRAME``: cuBLAS's, cuBLASLt's)? Such a block is no weight, whatever its size
    or its place (h14_pinn_second_order: the first matmul's 32 MiB and 1 MiB, made before the first
    forward and kept, were "parameters")."""
    return per_stack(trace, lambda fr: any(is_workspace_frame(fn, nm) for fn, _, nm in fr))
