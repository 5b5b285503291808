"""Live memory of a snapshot: what was allocated when it was taken, where, and (where the stack
says) what for; read from its ``segments`` alone, so it works for snapshots without history (the
block layouts torch writes: docs/trace.md)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from ..errors import RECORD_HINT, PhasememError
from .stacks import is_library, short_path

#: States whose bytes a tensor holds. torch's C++ writes ``active_pending_free`` for a block freed
#: on one stream and waiting on others; the docstring in torch/cuda/memory.py calls it
#: ``active_awaiting_free``. Both are still in use, so both count as allocated.
ALLOCATED_STATES = frozenset({"active_allocated", "active_pending_free", "active_awaiting_free"})
CATEGORIES = ("parameter", "optimizer_state", "unknown")

Frame = tuple  # (filename, line, name)

_OWN_DIR = os.path.dirname(os.path.abspath(__file__)).replace("\\", "/") + "/"
#: An autograd node's C++ frame: ``torch::autograd::generated::MmBackward0::apply(...)``.
_NODE = re.compile(r"^torch::autograd::generated::(\w+)::apply\(")


@dataclass
class LiveBlock:
    """One allocated block. ``size``: bytes the allocator gave it (rounded up);
    ``requested_size``: bytes asked for (``size`` where the snapshot does not say)."""

    address: int
    size: int
    requested_size: int
    state: str
    site: str | None  # "name (file:line)" of the innermost frame of the user's code; None: no frames
    stack: tuple  # (filename, line, name) frames, innermost first; () without frames
    category: str  # one of CATEGORIES


@dataclass
class LiveMemory:
    """Memory on one device at the moment the snapshot was taken. Byte counts of allocated memory
    are requested sizes; ``blocks`` are the allocated blocks only, largest first."""

    device: int
    allocated_bytes: int
    reserved_bytes: int
    cached_free_bytes: int  # inactive blocks: reserved, free, kept in the allocator's cache
    n_blocks: int
    blocks: list
    by_site: list  # (site or None, bytes, count), largest first
    by_category: dict  # category -> bytes, largest first
    devices: dict  # every device in the segments -> (allocated bytes, reserved bytes)
    has_frames: bool  # whether any allocated block on this device carries a stack


def live_memory(snapshot: Any, device: int | None = None) -> LiveMemory:
    """What was allocated on ``device`` when ``snapshot`` (a snapshot dict or a bare list of
    segments) was taken. ``device=None``: the device whose segments hold the most allocated bytes.
    What "allocated" sums, and why no segments is no error: docs/trace.md.

    Example:
        >>> live = live_memory(pickle.load(open("snapshot.pickle", "rb")))
        >>> live.device, format_bytes(live.allocated_bytes), live.by_site[0]
        (1, '9.90 GiB', ('lcm_diffusion_step (ptp_utils.py:258)', 8473401984, 5061))
    """
    if device is not None and (isinstance(device, bool) or not isinstance(device, int) or device < 0):
        raise ValueError(f"device={device!r}: give a CUDA device index (0, 1, ...) or None")
    segments = _segments(snapshot)
    devices = _per_device(segments)
    if device is None:
        # Ties (two empty devices) go to the lower index: cuda:0 is what a user expects by default.
        device = max(sorted(devices), key=lambda d: devices[d], default=0)
    mine = [s for s in segments if s["device"] == device]
    blocks: list[LiveBlock] = []
    seen: dict = {}
    cached_free = 0
    for seg in mine:
        for b in _blocks(seg, seen):
            if isinstance(b, LiveBlock):
                blocks.append(b)
            else:
                cached_free += b
    blocks.sort(key=lambda b: (-b.requested_size, b.address))
    return LiveMemory(
        device=device, allocated_bytes=sum(b.requested_size for b in blocks),
        reserved_bytes=sum(s["total_size"] for s in mine), cached_free_bytes=cached_free,
        n_blocks=len(blocks), blocks=blocks, by_site=_by_site(blocks), by_category=_by_category(blocks),
        devices=devices, has_frames=any(b.stack for b in blocks))


def _segments(snapshot: Any) -> list:
    """The segment list of a snapshot dict (or ``{"snapshot": ...}`` wrapper) or a bare list, checked."""
    if isinstance(snapshot, dict) and "segments" not in snapshot and isinstance(snapshot.get("snapshot"), dict):
        snapshot = snapshot["snapshot"]
    if isinstance(snapshot, dict):
        if "segments" not in snapshot:
            raise PhasememError(f"the snapshot dict has no 'segments' (keys: {sorted(map(str, snapshot))[:6]}); "
                                f"{RECORD_HINT}")
        segments = snapshot["segments"]
    elif isinstance(snapshot, list):
        segments = snapshot
    else:
        raise PhasememError(f"input holds a {type(snapshot).__name__}, not a memory snapshot; {RECORD_HINT}")
    if not isinstance(segments, list):
        raise PhasememError(f"the snapshot's 'segments' is a {type(segments).__name__}, not a list; "
                            "the snapshot is damaged or not one torch wrote")
    for i, seg in enumerate(segments):
        # Every key read later is checked here once: a damaged file is one clear line, not a KeyError.
        if (not isinstance(seg, dict) or any(k not in seg for k in ("device", "address", "total_size", "blocks"))
                or not isinstance(seg["blocks"], list)
                or any(not isinstance(b, dict) or "size" not in b for b in seg["blocks"])):
            raise PhasememError(f"segment {i} is not a segment dict with device, address, total_size and blocks "
                                "(each with a size); the snapshot is damaged or not one torch wrote")
    return segments


def _per_device(segments: list) -> dict:
    out: dict = {}
    for seg in segments:
        alloc = sum(_counted(b) for b in seg["blocks"] if b.get("state") in ALLOCATED_STATES)
        a, r = out.get(seg["device"], (0, 0))
        out[seg["device"]] = (a + alloc, r + seg["total_size"])
    return dict(sorted(out.items()))


def _counted(b: dict) -> int:
    return b["requested_size"] if "requested_size" in b else b["size"]


def _blocks(seg: dict, seen: dict):
    """Yield a LiveBlock for each allocated block of ``seg`` and the size of each inactive one;
    ``seen`` caches (stack, site, category) by the identities of a block's frame dicts."""
    addr = seg["address"]
    for b in seg["blocks"]:
        start = b.get("address", addr)
        addr = start + b["size"]
        if b.get("state") not in ALLOCATED_STATES:
            yield b["size"]
            continue
        hist = b.get("history")
        frames = (hist[0].get("frames") or []) if hist else (b.get("frames") or [])
        # Blocks share their frame dicts (one object per distinct frame), so the frames' identities
        # name a stack: the 6,240 allocated blocks of one wild file have 52. The ids stay valid while the
        # snapshot is alive, which it is for this whole call.
        key = tuple(map(id, frames))
        known = seen.get(key)
        if known is None:
            stack = tuple((f["filename"], f["line"], f["name"]) for f in frames)
            known = seen[key] = (stack, site_of(stack), category_of(stack))
        yield LiveBlock(address=start, size=b["size"], requested_size=_counted(b), state=b["state"],
                        site=known[1], stack=known[0], category=known[2])


def _is_users(fn: str) -> bool:
    # Old IPython names cells "<ipython-input-N-...>": user code, though "<...>" is otherwise not.
    if fn.startswith("<ipython-input-"):
        return True
    return fn.endswith(".py") and not is_library(fn) and not fn.replace("\\", "/").startswith(_OWN_DIR)


def site_of(stack: tuple) -> str | None:
    """'name (file:line)' of the innermost frame of the user's own code (not torch, site-packages or
    phasemem); without one, of the innermost Python frame outside torch, then of the innermost frame.
    None for an empty stack.

    Example:
        >>> site_of((("/env/site-packages/torch/nn/functional.py", 9, "linear"), ("/home/me/train.py", 40, "step")))
        'step (train.py:40)'
    """
    if not stack:
        return None
    py = [f for f in stack if f[0].endswith(".py")]
    if not py:
        # C++ frames only (torch's default stacks="all" on the autograd thread): the innermost frame
        # is the unwinder's; the autograd node that ran says where (h7_state_only: 54 gradients)
        node = next((m.group(1) for f in stack if (m := _NODE.match(f[2]))), None)
        if node:
            return f"{node} (backward, autograd thread)"
        if any(f[2].startswith("torch::autograd::Engine::") for f in stack):
            return "backward (autograd thread)"
    pick = (next((f for f in stack if _is_users(f[0])), None)
            or next((f for f in py if "/torch/" not in f[0].replace("\\", "/")), None) or stack[0])
    fn, line, name = pick
    fn = fn.replace("\\", "/")  # short_path cuts at "site-packages/": Windows paths need the same slashes
    return f"{name} ({short_path(fn)}:{line})"


def category_of(stack: tuple) -> str:
    """'parameter', 'optimizer_state' or 'unknown' from the frames alone; the innermost frame that
    a rule knows decides.

    Example:
        >>> category_of((("/env/site-packages/torch/optim/adam.py", 160, "_init_group"),))
        'optimizer_state'
    """
    for fn, _, name in stack:
        fn = fn.replace("\\", "/")
        # torch/optim/: Optimizer.step makes exp_avg, exp_avg_sq, momentum_buffer there on its first
        # call (adam.py/sgd.py _init_group) and Optimizer.load_state_dict casts loaded state there.
        # step's temporaries come from there too, but die before step returns: a block still alive
        # at a snapshot taken outside step is state (one taken inside it, by an OOM hook, may not be).
        if "/torch/optim/" in fn:
            return "optimizer_state"
        # torch/nn/modules/module.py: Module._apply is what .to()/.cuda()/.half() run to replace each
        # parameter and buffer with its moved copy; load_state_dict/_load_from_state_dict write a
        # checkpoint into them. Buffers (BatchNorm statistics) count as parameters here.
        if fn.endswith("torch/nn/modules/module.py") and name in ("_apply", "load_state_dict",
                                                                  "_load_from_state_dict"):
            return "parameter"
    return "unknown"


def _by_site(blocks: list) -> list:
    acc: dict = {}
    for b in blocks:
        n, c = acc.get(b.site, (0, 0))
        acc[b.site] = (n + b.requested_size, c + 1)
    return sorted(((s, n, c) for s, (n, c) in acc.items()), key=lambda t: (-t[1], t[0] is None, t[0] or ""))


def _by_category(blocks: list) -> dict:
    acc = dict.fromkeys(CATEGORIES, 0)
    for b in blocks:
        acc[b.category] += b.requested_size
    return {c: n for c, n in sorted(acc.items(), key=lambda t: -t[1]) if n}
