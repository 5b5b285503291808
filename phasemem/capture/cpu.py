"""CPU capture: ``torch.profiler`` memory events turned into a snapshot dict of the CUDA format.

Without CUDA there is no caching allocator to record, but ``profile(profile_memory=True)`` sees every
CPU allocation and free (``ptr``, signed ``alloc_size``) and every ``record_function`` range. Both come
out of ``experimental_event_tree()`` stamped by the profiler's clock, which is mapped onto the host's
``time.time_ns()`` through two anchor ranges (docs/trace.md, "The CPU trace's clock") and converted,
``ns // 1000``, to the ``time_us`` the CUDA snapshot uses.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Iterable

import torch
from torch.profiler import ProfilerActivity, profile

from .hooks import PREFIX
from .torch_side import plain_tensors

# PyTorch's own optimizer ranges ("Optimizer.step#AdamW.step", "Optimizer.zero_grad#AdamW.zero_grad"),
# kept as the CUDA snapshot keeps them, so the annotation fallback sees the same names on CPU.
ANNOTATION_PREFIXES = (PREFIX, "Optimizer.")
# ... and the user's own ``record_function("tag::phase")`` ranges, as the CUDA recording keeps every
# range (``global_record_annotations``): ``--markers tag::`` and ground-truth ``gt::`` marks need them.
# Operators are TorchOp nodes too; their namespaces are not ranges.
_OP_NAMESPACES = frozenset(("aten", "prim", "prims", "quantized", "c10d", "_c10d_functional", "profiler", "cuda",
                            "inductor", "triton", "torchvision", "cudnn", "mkldnn", "fbgemm", "torch", "autograd"))


def _is_range(name: str, fields=None) -> bool:
    """Whether a profiler op is a range to keep: a ``record_function`` (``USER_SCOPE``, the ranges the
    CUDA recording's annotation callback keeps, DDP's ``DistributedDataParallel.forward`` among them),
    or an op whose name has a namespace that is no operator library's."""
    if _USER_SCOPE is not None and getattr(fields, "scope", None) == _USER_SCOPE:
        return True
    # C++ ranges of FUNCTION scope with a namespace of their own (DDP's
    # "torch.distributed.ddp.reducer::copy_bucket_to_grad") are kept too, as before.
    return name.startswith(ANNOTATION_PREFIXES) or ("::" in name and name.split("::", 1)[0] not in _OP_NAMESPACES)


_USER_SCOPE = getattr(getattr(torch.autograd, "RecordScope", None) or getattr(torch._C._autograd, "RecordScope", None)
                      or getattr(torch._C._profiler, "RecordScope", None), "USER_SCOPE", None)

# The ranges that tie the profiler's clock to the host's, one after start and one before stop; never
# kept as marks.
CLOCK_ANCHOR = PREFIX + "clock"
# Anchors taken at each end: the first range after start is slow (0.03-0.8 ms wide on this machine),
# the next ones 20-40 µs; their bounds intersect.
ANCHORS = 3

CPU_DEVICE = -1  # the fake segments' and annotations' "device": no CUDA ordinal applies


def profiler_enabled() -> bool:
    probe = getattr(torch.autograd.profiler, "_is_profiler_enabled", None)
    if isinstance(probe, bool):
        return probe
    fn = getattr(torch._C._autograd, "_profiler_enabled", None)
    return bool(fn()) if fn is not None else False


@contextlib.contextmanager
def _quiet_native_stderr():
    """Silence what the profiler's C++ side prints on start and stop (torch 2.13 writes
    "USDT: ... profiler_start" lines to fd 2); Python's own stderr is untouched."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2 (an embedded interpreter): nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def start_profiler() -> profile:
    prof = profile(
        activities=[ProfilerActivity.CPU],
        profile_memory=True,
        record_shapes=False,
        with_stack=False,
    )
    with _quiet_native_stderr():
        prof.start()
    prof._phasemem_clock = [_anchor() for _ in range(ANCHORS)]  # type: ignore[attr-defined]
    return prof


def stop_profiler(prof: profile) -> None:
    anchors = getattr(prof, "_phasemem_clock", None)
    if anchors is not None:
        anchors.extend(_anchor() for _ in range(ANCHORS))
    with _quiet_native_stderr():
        prof.stop()


def _anchor() -> tuple[int, int]:
    """The host clock read just before and just after an empty anchor range the profiler stamps."""
    h0 = time.time_ns()
    with torch.profiler.record_function(CLOCK_ANCHOR):
        pass
    return h0, time.time_ns()


def _host_clock(anchors: list[tuple[int, int]], stamped: list[tuple[int, int]]):
    """The map from the profiler's nanoseconds to the host's. Each anchor bounds the offset (host minus
    profiler) to [h0 - p0, h1 - p1]; where the profiler's own conversion lies inside every bound it is
    kept as it is, else it is shifted by the least that brings it inside, at the start and at the end,
    and linearly between them."""
    if not anchors or len(anchors) != len(stamped):
        return lambda ns: ns  # a profiler started elsewhere: its clock as it is
    bounds = [(h0 - p0, h1 - p1, p0) for (h0, h1), (p0, p1) in zip(anchors, stamped)]
    half = len(bounds) // 2 or 1  # the anchors taken at the start, then those at the end
    ends = []
    for group in (bounds[:half], bounds[half:] or bounds[:half]):
        lo, hi = max(g[0] for g in group), min(g[1] for g in group)
        # bounds that contradict each other (a host clock coarser than the anchors): no evidence, no shift
        shift = 0 if lo <= 0 <= hi or lo > hi else lo if lo > 0 else hi
        ends.append((group[-1][2], shift))
    (p_a, d_a), (p_b, d_b) = ends
    if d_a == d_b == 0:
        return lambda ns: ns
    slope = (d_b - d_a) / (p_b - p_a) if p_b != p_a else 0.0
    return lambda ns: ns + int(round(d_a + (ns - p_a) * slope))


def snapshot_from_profiler(prof: profile, live: Iterable[torch.Tensor] = ()) -> dict:
    """The finished profiler's allocations and marker ranges as a snapshot dict.

    ``live`` are tensors that exist at the end (parameters, buffers, grads, optimizer state): each
    distinct CPU storage becomes a one-block segment, which the trace loader counts as memory that
    pre-existed the recording when the trace never allocated its address.
    """
    from torch._C._profiler import _EventType, _ExtraFields_Allocation

    alloc_type, op_type = _EventType.Allocation, _EventType.TorchOp
    trace: list[tuple[int, int, dict]] = []
    marks: list[tuple[int, int, int, dict]] = []
    stamped: list[tuple[int, int]] = []

    # The one per-event pass: a depth-first walk of the event tree (every thread's roots).
    # a stopped profiler holds its results
    assert prof.profiler is not None and prof.profiler.kineto_results is not None
    roots = prof.profiler.kineto_results.experimental_event_tree()
    stack = [(node, 0) for node in reversed(roots)]
    seq = 0
    while stack:
        node, depth = stack.pop()
        kind, fields = node.typed
        if kind == alloc_type:
            assert isinstance(fields, _ExtraFields_Allocation)  # the kind says which fields
            size = fields.alloc_size
            if size and fields.device.type == "cpu":
                t = node.start_time_ns
                trace.append((t, seq, {
                    "action": "alloc" if size > 0 else "free_completed",
                    "addr": int(fields.ptr),
                    "size": abs(int(size)),
                    "stream": 0,
                    "frames": [],
                }))
                seq += 1
        elif kind == op_type and node.name == CLOCK_ANCHOR:
            stamped.append((node.start_time_ns, node.end_time_ns))
        elif kind == op_type and _is_range(node.name, fields):
            name = str(node.name)
            t0, t1 = node.start_time_ns, node.end_time_ns
            # Ties: at one instant an END sorts before a START; nested STARTs open outer first
            # and nested ENDs close inner first, so a stack-based reader stays balanced.
            marks.append((t0, 1, depth, {"name": name, "stage": "START", "device": CPU_DEVICE}))
            marks.append((t1, 0, -depth, {"name": name, "stage": "END", "device": CPU_DEVICE}))
        # Reversed, so nodes pop in pre-order: ``seq`` then orders same-nanosecond events as they happened.
        stack.extend((child, depth + 1) for child in reversed(node.children))

    trace.sort(key=lambda e: (e[0], e[1]))
    marks.sort(key=lambda e: e[:3])
    host = _host_clock(getattr(prof, "_phasemem_clock", None) or [], sorted(stamped))
    for t, _, entry in trace:
        entry["time_us"] = host(t) // 1000
    for t, _, _, entry in marks:
        entry["time_us"] = host(t) // 1000

    return {
        "segments": _segments(live),
        "device_traces": [[e for _, _, e in trace]],
        "external_annotations": [m for *_, m in marks],
    }


def _segments(live: Iterable[torch.Tensor]) -> list[dict]:
    seen: dict[int, int] = {}
    for outer in live:
        if outer is None:
            continue
        for t in plain_tensors(outer):
            if t.device.type != "cpu" or t.is_sparse:
                continue
            try:
                storage = t.untyped_storage()
                ptr, nbytes = storage.data_ptr(), storage.nbytes()
            except (RuntimeError, NotImplementedError):  # no real storage (meta-like, freed, functional)
                continue
            if ptr and nbytes:
                seen[ptr] = max(nbytes, seen.get(ptr, 0))
    return [
        {
            "device": CPU_DEVICE,
            "address": ptr,
            "total_size": nbytes,
            "stream": 0,
            "segment_type": "cpu",
            "blocks": [{
                "address": ptr,
                "size": nbytes,
                "requested_size": nbytes,
                "state": "active_allocated",
                "frames": [],
            }],
        }
        for ptr, nbytes in sorted(seen.items())
    ]
