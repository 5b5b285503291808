"""The columnar trace: one device's allocator events as numpy arrays, plus stacks and markers.

Built in a single pass over the snapshot's ``device_traces[device]`` list; everything after this
works on arrays. Indices into the arrays are indices into the original trace list, so an event
number phasemem reports is the one memory_viz shows.
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from ..errors import RECORD_HINT, PhasememError
from .torch_labels import TorchLabels
from .torch_labels import from_values as labels_from_values

# Codes for the ``action`` column. ``free`` is what older snapshots wrote for a completed free.
ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
    "free",
    "unknown",
)
A = {name: code for code, name in enumerate(ACTIONS)}


@contextlib.contextmanager
def no_gc():
    """Pause the cyclic collector: building millions of acyclic objects otherwise triggers it
    over and over (it more than doubles the time to unpickle or columnarise a large trace)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Codes(dict):
    def __missing__(self, key):
        return A["unknown"]


_CODES = _Codes(A)

_frame_key = itemgetter("filename", "line", "name")




@dataclass
class Markers:
    """``record_function`` START/END annotations, in time order."""

    name: list[str]
    start: np.ndarray  # bool: True for START, False for END
    time_us: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.name)


@dataclass
class Trace:
    """One device's allocator trace as columns.

    Example:
        >>> t = Trace.from_snapshot(snapshot)
        >>> t.size[t.action == A["alloc"]].sum()
    """

    device: int
    action: np.ndarray  # int8 codes into ACTIONS
    addr: np.ndarray  # int64
    size: np.ndarray  # int64
    stream: np.ndarray  # int64
    time_us: np.ndarray  # int64
    stack: np.ndarray  # int32 index into ``stacks``; -1 where the event has no frames
    stacks: list[tuple[int, ...]]  # frame ids, innermost first
    frames: list[tuple[str, int, str]]  # (filename, line, name)
    markers: Markers
    live_blocks: np.ndarray  # (k, 2) int64: (addr, size) of blocks allocated when the snapshot was taken
    oom_device_free: dict  # event index → bytes the device had free, for each ``oom`` event
    reserved_at_snapshot: int
    n_devices: int = 1
    meta: dict = field(default_factory=dict)
    #: The snapshot's other devices, a few numbers each (``device_activity``): what the report names
    #: so that work or an out-of-memory on another GPU is never silently left out.
    other_devices: list = field(default_factory=list)
    # Event 0 here is this event of the recorded trace: nonzero when only some steps were loaded
    # (``phasemem.read.columnar``); every index elsewhere in the Trace counts from here.
    first_event: int = 0
    #: Addresses of the blocks alive when the snapshot was taken, made before the trace, whose
    #: allocation stack (``segments`` keeps it from an earlier recording of the process) passes
    #: through a math library's workspace getter: no weight, whatever its size (``WORKSPACE_FRAME``).
    live_workspaces: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: The labels the program set with ``torch.cuda.memory._set_memory_metadata``, which torch writes
    #: into every entry's ``user_metadata`` (``phasemem.read.torch_labels``); None where no entry carries
    #: one, and in a slice of steps (``step_index.cut``).
    torch_labels: TorchLabels | None = None
    #: The allocator's segments when the snapshot was taken, (k, 4) int64: address, total size,
    #: stream, 1 where a CUDA graph's private pool holds it; and every block in them, (m, 3) int64:
    #: address, size (the block's, rounded), 1 where allocated. None where unknown (a slice of steps, an .npz written before): what
    #: ``phasemem.predictions.allocator`` lays the trace's first state out from.
    segments: np.ndarray | None = None
    segment_blocks: np.ndarray | None = None
    #: ``snapshot["allocator_settings"]`` (torch >= 2.5): expandable segments, max_split_size...
    allocator_settings: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.action)

    @classmethod
    def from_snapshot(cls, snapshot: dict, device: int | None = None) -> "Trace":
        traces = snapshot.get("device_traces") or []
        if device is None:
            device = busiest_device(snapshot)
        if not 0 <= device < len(traces):
            raise PhasememError(
                f"device {device} is not in this snapshot (it has devices 0..{len(traces) - 1}); pick one with --device"
            )
        events = traces[device]
        if not events:
            raise PhasememError(f"device {device} has an empty trace; {RECORD_HINT}")
        try:
            with no_gc():
                return cls._columnarise(snapshot, events, device, len(traces))
        except OverflowError:
            raise PhasememError(_TOO_LARGE.format(f"device {device}'s trace")) from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PhasememError(
                f"device {device}'s trace entries are malformed ({type(e).__name__}: {e}); is this a torch memory snapshot?"
            ) from None

    @classmethod
    def _columnarise(cls, snapshot: dict, events: list, device: int, n_devices: int) -> "Trace":
        n = len(events)
        # No default for the action: an entry without one is not an allocator event.
        action = np.fromiter(map(_CODES.__getitem__, map(itemgetter("action"), events)), dtype=np.int8, count=n)
        stack, stacks, frames = _intern_stacks(_column(events, "frames", None), n)
        # OOM entries are rare; read their one extra field from the few of them.
        ooms = np.flatnonzero(action == A["oom"]).tolist()
        return cls.from_columns(
            snapshot, device, n_devices, action=action, addr=_int_column(events, "addr"),
            size=_int_column(events, "size"), stream=_int_column(events, "stream"),
            time_us=_int_column(events, "time_us"), stack=stack, stacks=stacks, frames=frames,
            oom_device_free={i: int(events[i].get("device_free", 0) or 0) for i in ooms},
            torch_labels=labels_from_values(_column(events, "user_metadata", "")),
        )

    @classmethod
    def from_columns(cls, snapshot: dict, device: int, n_devices: int, **columns) -> "Trace":
        """A Trace from one device's event columns (``action`` … ``oom_device_free``, as the fields
        are named) and what the rest of the snapshot says: live blocks, reserved bytes, markers.
        The streaming reader (``phasemem.read.batched``, ``phasemem.read.decoder``) builds the columns without a list of events."""
        try:
            return cls._from_columns(snapshot, device, n_devices, **columns)
        except OverflowError:  # a block's address or size, an annotation's time: past int64
            raise PhasememError(_TOO_LARGE.format("the snapshot's segments or annotations")) from None

    @classmethod
    def _from_columns(cls, snapshot: dict, device: int, n_devices: int, **columns) -> "Trace":
        blocks = [
            b for seg in snapshot.get("segments") or []
            if seg.get("device", device) in (device, -1)
            for b in _blocks_with_addresses(seg)
            if b.get("state") in ("active_allocated", "active_pending_free")
        ]
        live = [(b.get("address", 0), b.get("requested_size", b.get("size", 0))) for b in blocks]
        reserved = sum(
            int(seg.get("total_size", 0)) for seg in snapshot.get("segments") or []
            if seg.get("device", device) == device
        )
        if not -_I64 <= reserved < _I64:  # the reserved curve is int64
            raise OverflowError("reserved bytes")
        live_bytes = _live_bytes(snapshot) if n_devices > 1 else {}  # every segment read once, not per device
        segments, segment_blocks = _layout(snapshot, device)
        settings = snapshot.get("allocator_settings")
        return cls(
            segments=segments, segment_blocks=segment_blocks,
            allocator_settings=dict(settings) if isinstance(settings, dict) else {},
            device=device,
            other_devices=[device_activity(snapshot, d, live_bytes) for d in range(n_devices) if d != device],
            # Without event times (older snapshots) annotations cannot be placed among the events.
            markers=_markers(snapshot, device) if columns["time_us"].any() else _markers({}, device),
            live_blocks=np.array(live, dtype=np.int64).reshape(-1, 2),
            live_workspaces=np.array([b.get("address", 0) for b in blocks if _made_by_workspace(b)], dtype=np.int64),
            reserved_at_snapshot=reserved,
            n_devices=n_devices,
            meta=dict(snapshot.get("phasemem") or {}),
            **columns,
        )


_I64 = 1 << 63
#: What a number past 64 bits (a corrupt file: torch writes addresses, sizes and times as int64) is told.
_TOO_LARGE = ("{} holds a number too large for 64 bits (an address, size or time): the file is corrupt; "
              "copy it again or re-record it")


#: A C++ frame whose name holds this made a math library's workspace: cuBLAS's per handle and
#: stream (``at::cuda::setWorkspaceForHandle`` in torch 2.11, ``at::cuda::getNewWorkspace`` in the
#: torch of wild/kkaitlyn_ctx256_forward_mixed; 32 MiB each on Hopper) and cuBLASLt's
#: (``at::cuda::getCUDABlasLtWorkspace``, 1 MiB). In heldout13's inference traces (and every later
#: workload of a process that ran a matmul under an earlier recording) these blocks came from before
#: the trace, beside the weights, and were "parameters" (h13_embeddings_cat_growth: 105 MiB of them
#: for 40 MiB of weights); one of the weights there has the workspace's 32 MiB too.
WORKSPACE_FRAME = "Workspace"


def is_workspace_frame(filename: str, name: str) -> bool:
    """A C++ frame of a math library's workspace getter (see WORKSPACE_FRAME)."""
    return WORKSPACE_FRAME in name and not filename.endswith(".py")


def _made_by_workspace(block: dict) -> bool:
    frames = block.get("frames") or ()
    return any(is_workspace_frame(str(f.get("filename", "")), str(f.get("name", "")))
               for f in frames if isinstance(f, dict))


def from_stand_in(obj, stand_in, device: int | None) -> "Trace | None":
    """The Trace of an unpickled snapshot ``obj`` in which one device's list of events was replaced,
    while unpickling, by ``stand_in`` (its ``columns()`` are that list as columns): None where that
    is not the device to read (another is asked for, or busier) or the layout is another."""
    if isinstance(obj, dict) and "device_traces" not in obj and isinstance(obj.get("snapshot"), dict):
        obj = obj["snapshot"]
    traces = obj.get("device_traces") if isinstance(obj, dict) else None
    if not isinstance(traces, list):
        return None
    mine = [i for i, t in enumerate(traces) if t is stand_in]
    if len(mine) != 1:
        return None
    if device is None:
        device = busiest_device(obj)
    if device != mine[0]:
        # another device's list was read whole, and may share objects with the stand-in's
        return None
    return Trace.from_columns(obj, device, len(traces), **stand_in.columns())


_MEMORY_EVENTS = frozenset(("alloc", "free_requested", "free_completed", "free", "segment_alloc", "segment_free",
                            "segment_map", "segment_unmap", "oom"))


def _live_bytes(snapshot: dict) -> dict[int, int]:
    """Bytes allocated per device when the snapshot was taken, from its segments."""
    out: dict[int, int] = {}
    for seg in snapshot.get("segments") or []:
        if not isinstance(seg, dict):
            continue
        d = seg.get("device", 0)
        out[d] = out.get(d, 0) + sum(int(b.get("requested_size", b.get("size", 0)) or 0) for b in seg.get("blocks") or []
                                     if b.get("state") in ("active_allocated", "active_pending_free"))
    return out


def busiest_device(snapshot: dict) -> int:
    """The device with the most recorded activity: memory events, then (legacy snapshots hold one
    entry per device) the bytes its segments hold. layoutedit_dump in ../shared/wild has one entry on
    each of two devices and every segment on cuda:1; the first device would say 'peak 0 B'."""
    traces = snapshot.get("device_traces") or []
    live = _live_bytes(snapshot)
    counts = [len(t) if hasattr(t, "__len__") else 0 for t in traces]
    # a list of one entry is a legacy recording's marker, not activity
    key = [(c if c > 1 else 0, live.get(d, 0)) for d, c in enumerate(counts)]
    return max(range(len(key)), key=lambda d: (key[d], -d)) if key else 0


def device_activity(snapshot: dict, device: int, live_bytes: dict[int, int] | None = None) -> dict:
    """A few numbers about one device of a snapshot: its memory events, its out-of-memory events
    (event index, bytes asked, bytes the device had free), the bytes allocated and reserved at the end.
    ``live_bytes``: ``_live_bytes(snapshot)``, when the caller has it already."""
    events = (snapshot.get("device_traces") or [])[device]
    events = events if isinstance(events, list) else []
    n = sum(1 for e in events if isinstance(e, dict) and e.get("action") in _MEMORY_EVENTS)
    ooms = [(i, int(e.get("size", 0) or 0), int(e.get("device_free", 0) or 0))
            for i, e in enumerate(events) if isinstance(e, dict) and e.get("action") == "oom"]
    reserved = sum(int(seg.get("total_size", 0) or 0) for seg in snapshot.get("segments") or []
                   if isinstance(seg, dict) and seg.get("device", 0) == device)
    live = _live_bytes(snapshot) if live_bytes is None else live_bytes
    return {"device": device, "events": n, "ooms": ooms, "allocated_bytes": live.get(device, 0),
            "reserved_bytes": reserved}


def _int_column(events: list, key: str) -> np.ndarray:
    """An integer field of every event, straight into an array (0 where an older format lacks it)."""
    try:
        return np.fromiter(map(itemgetter(key), events), dtype=np.int64, count=len(events))
    except KeyError:
        return np.fromiter((e.get(key) or 0 for e in events), dtype=np.int64, count=len(events))


def _column(events: list, key: str, default):
    """One field of every event; itemgetter keeps the loop in C, .get covers older formats."""
    try:
        return list(map(itemgetter(key), events))
    except KeyError:
        return [e.get(key, default) for e in events]


def _intern_stacks(frame_lists: list, n: int):
    """Stack id per event (-1 without frames), the distinct stacks as frame ids, and the frames.

    torch shares frame dicts (and often whole frame lists) between events, so stacks are keyed
    first by object identity, which is cheap, and only then by content.
    """
    by_ids: dict[tuple, int] = {}
    by_content: dict[tuple, int] = {}

    def stack_of(fr) -> int:
        if not fr:
            return -1
        ids = tuple(map(id, fr))
        sid = by_ids.get(ids)
        if sid is None:
            sid = by_ids[ids] = by_content.setdefault(tuple(map(_frame_key, fr)), len(by_content))
        return sid

    # Only distinct list objects need the Python-level lookup; np.unique maps the rest back.
    list_ids, first, inverse = np.unique(np.fromiter(map(id, frame_lists), dtype=np.int64, count=n),
                                         return_index=True, return_inverse=True)
    per_list = np.fromiter((stack_of(frame_lists[i]) for i in first.tolist()), dtype=np.int32, count=len(first))
    stack = per_list[inverse.reshape(-1)]
    stacks, frames = _stack_table(by_content)
    return stack, stacks, frames


def _stack_table(by_content: dict) -> tuple[list[tuple[int, ...]], list[tuple]]:
    """Distinct stacks (keyed by their frames' contents, in id order) as tuples of frame ids, and
    the distinct frames those ids name."""
    frame_ids: dict[tuple, int] = {}
    stacks = [tuple(frame_ids.setdefault(f, len(frame_ids)) for f in k) for k in by_content]
    # Windows writes C:\...\torch\nn\modules\module.py; every rule on file names reads '/'
    # (magma27_cs336 in ../shared/wild was recorded on Windows).
    return stacks, [(str(fn).replace("\\", "/"), line, name) for fn, line, name in frame_ids]


def _layout(snapshot: dict, device: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """This device's segments and their blocks (``Trace.segments``, ``Trace.segment_blocks``); None
    where a segment lacks its address or size."""
    segs: list[tuple[int, int, int, int]] = []
    blocks: list[tuple[int, int, int]] = []
    for seg in snapshot.get("segments") or []:
        if not isinstance(seg, dict) or seg.get("device", device) != device:
            continue
        if "address" not in seg or "total_size" not in seg:
            return None, None
        pool = seg.get("segment_pool_id") or (0, 0)
        private = int(any(int(x or 0) for x in pool)) if isinstance(pool, (list, tuple)) else int(bool(pool))
        segs.append((int(seg["address"]), int(seg["total_size"]), int(seg.get("stream", 0) or 0), private))
        blocks.extend((int(b["address"]), int(b.get("size", 0)), int(b.get("state") in ("active_allocated",
                                                                                           "active_pending_free")))
                      for b in _blocks_with_addresses(seg))
    return np.array(segs, np.int64).reshape(-1, 4), np.array(blocks, np.int64).reshape(-1, 3)


def _blocks_with_addresses(seg: dict):
    # Blocks carry their address in recent torch; older snapshots only lay them out in order.
    addr = seg.get("address", 0)
    for b in seg.get("blocks") or []:
        if "address" not in b:
            b = {**b, "address": addr}
        addr = b["address"] + b.get("size", 0)
        yield b


def _markers(snapshot: dict, device: int) -> Markers:
    anns = [a for a in snapshot.get("external_annotations") or [] if isinstance(a, dict) and "time_us" in a]
    # Annotations carry the device that was current when they fired; the autograd thread may
    # report another, so fall back to every annotation when none names this device.
    mine = [a for a in anns if a.get("device", device) in (device, -1, None)]
    anns = sorted(mine or anns, key=lambda a: a["time_us"])
    return Markers(
        name=[str(a.get("name", "")) for a in anns],
        start=np.array([a.get("stage") == "START" for a in anns], dtype=bool),
        time_us=np.array([a["time_us"] for a in anns], dtype=np.int64),
    )
